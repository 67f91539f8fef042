package dataset

import (
	"fmt"
	"slices"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// rowsOf returns rows [lo, hi) of a batched element, sharing its memory;
// with squeeze, the single row lo without its leading dimension. rows is
// batchRows(e).
func rowsOf(e hostElem, lo, hi int, squeeze bool) (hostElem, error) {
	out := hostElem{cols: make([]namedColumn, len(e.cols)), origin: e.origin}
	for j, c := range e.cols {
		k, err := kindFor(c.dtype)
		if err != nil {
			return hostElem{}, fmt.Errorf("feature %q: %w", c.name, err)
		}
		data, err := c.view()
		if err != nil {
			return hostElem{}, fmt.Errorf("feature %q: %w", c.name, err)
		}
		rowSize := int(numElements(c.shape[1:]))
		shape := append([]int64{int64(hi - lo)}, c.shape[1:]...)
		if squeeze {
			shape = shape[1:]
		}
		out.cols[j] = namedColumn{c.name, column{dtype: c.dtype, shape: shape, data: k.sliceData(data, lo*rowSize, hi*rowSize)}}
	}
	return out, nil
}

// concatRows joins batched elements of the same names, dtypes and row shapes
// along their first dimension.
func concatRows(parts []hostElem) (hostElem, error) {
	if len(parts) == 1 {
		return parts[0], nil
	}
	first := parts[0]
	out := hostElem{cols: make([]namedColumn, len(first.cols)), origin: first.origin}
	for j, c0 := range first.cols {
		k, err := kindFor(c0.dtype)
		if err != nil {
			return hostElem{}, fmt.Errorf("feature %q: %w", c0.name, err)
		}
		datas := make([]any, len(parts))
		var rows int64
		for i, p := range parts {
			if err := sameSpec(p, first, 1); err != nil {
				return hostElem{}, err
			}
			c := p.cols[j]
			if datas[i], err = c.view(); err != nil {
				return hostElem{}, fmt.Errorf("feature %q: %w", c.name, err)
			}
			rows += c.shape[0]
		}
		shape := append([]int64{rows}, c0.shape[1:]...)
		out.cols[j] = namedColumn{c0.name, column{dtype: c0.dtype, shape: shape, data: joinRows(k, datas, int(numElements(shape)), int(numElements(c0.shape[1:])))}}
	}
	return out, nil
}

// sameSpec checks that e has the names and dtypes of want and, past the
// first skip dimensions, the same shapes.
func sameSpec(e, want hostElem, skip int) error {
	if !sameNames(e.cols, want.cols) {
		return fmt.Errorf("%w: element holds {%s}, expected {%s}", ErrShape, describe(e.cols), describe(want.cols))
	}
	for j, c := range e.cols {
		w := want.cols[j]
		same := c.dtype == w.dtype && len(c.shape) == len(w.shape)
		for d := skip; same && d < len(c.shape); d++ {
			same = c.shape[d] == w.shape[d]
		}
		if !same {
			return fmt.Errorf("%w: feature %q is %s%v, expected %s%v%s", ErrShape, c.name,
				graphutil.DTypeName(c.dtype), c.shape, graphutil.DTypeName(w.dtype), w.shape, at(e.origin))
		}
	}
	return nil
}

// sameNames reports whether cols hold values of the names of want, in the
// same order.
func sameNames(cols, want []namedColumn) bool {
	return slices.EqualFunc(cols, want, func(a, b namedColumn) bool { return a.name == b.name })
}
