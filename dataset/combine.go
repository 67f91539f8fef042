package dataset

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// multi is a dataset of this package that reads several inputs
// (Concatenate, Zip). For a rewrite it is the bottom of a pipeline, like a
// source: pipeline() ends at it, FILE sharding refuses it (dividing several
// inputs among workers would change which elements meet), and rebuild gives
// it fresh copies of its inputs' pipelines.
type multi interface {
	node
	inputs() []Dataset
	withInputs(ins []Dataset) node
	opName() string
}

// Concatenate returns the elements of a followed by those of b, as tf.data's
// concatenate. Their elements must have the same names and dtypes (shapes may
// differ, as tf.data allows); the first element of b that does not match
// the first of a ends the pass with an error naming the feature and both
// specs.
func Concatenate(a, b Dataset) Dataset {
	if a == nil || b == nil {
		return invalid("Concatenate: nil Dataset")
	}
	for _, ds := range []Dataset{a, b} {
		if err := Err(ds); err != nil {
			return failed{err}
		}
	}
	return &concatDS{a: a, b: b}
}

type concatDS struct{ a, b Dataset }

func (d *concatDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *concatDS) input() Dataset                                 { return nil }
func (d *concatDS) withInput(Dataset) node                         { return d }
func (d *concatDS) inputs() []Dataset                              { return []Dataset{d.a, d.b} }
func (d *concatDS) withInputs(ins []Dataset) node                  { return &concatDS{a: ins[0], b: ins[1]} }
func (d *concatDS) opName() string                                 { return "Concatenate" }
func (d *concatDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.a)
	if err != nil {
		return nil, err
	}
	return &concatIter{d: d, up: up, pass: ctx}, nil
}

type concatIter struct {
	d       *concatDS
	up      hostIter
	pass    context.Context // the pass's context, which b's pass is opened with
	second  bool            // reading b
	checked bool            // b's first element matched a's
	spec    []namedColumn   // of a's first element
	s       sticky
}

func (it *concatIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for {
		if it.up == nil { // a has ended: start b
			up, err := openHost(it.pass, it.d.b)
			if err != nil {
				return hostElem{}, it.s.fail(ctx, err)
			}
			it.up = up
		}
		e, err := it.up.next(ctx)
		if err == io.EOF && !it.second {
			err = it.up.close()
			it.up, it.second = nil, true
			if err != nil {
				return hostElem{}, it.s.fail(ctx, err)
			}
			continue
		}
		if err != nil {
			return hostElem{}, it.s.fail(ctx, err)
		}
		switch {
		case !it.second && it.spec == nil:
			it.spec = e.cols
		case it.second && !it.checked:
			it.checked = true
			if err := sameNamesAndTypes(e.cols, it.spec); it.spec != nil && err != nil {
				it.s.err = fmt.Errorf("dataset: Concatenate: %w", err)
				return hostElem{}, it.s.err
			}
		}
		return e, nil
	}
}

func (it *concatIter) close() error {
	if it.up == nil {
		return nil
	}
	return it.up.close()
}

// sameNamesAndTypes checks that cols have the names and dtypes of want.
func sameNamesAndTypes(cols, want []namedColumn) error {
	if !sameNames(cols, want) {
		return fmt.Errorf("%w: the second dataset's elements hold {%s}, the first's {%s}", ErrShape, describe(cols), describe(want))
	}
	for i, c := range cols {
		if c.dtype != want[i].dtype {
			return fmt.Errorf("%w: feature %q is %s%v in the second dataset, %s%v in the first", ErrShape,
				c.name, graphutil.DTypeName(c.dtype), c.shape, graphutil.DTypeName(want[i].dtype), want[i].shape)
		}
	}
	return nil
}

// ZipOption configures Zip.
type ZipOption interface{ applyZip(*zipConfig) }

type zipConfig struct{ log *zap.Logger }

// Zip returns elements that join the elements of datasets at the same
// position, as tf.data's zip: element i holds the values of element i of
// every dataset, whose names must all differ (tf.data's tuple of elements
// becomes one element of every name). It stops at the end of the shortest
// dataset, as tf.data does, and logs at debug level which one ended while
// the others still had elements (WithLogger). It reads the inputs as
// tf.data does, in order until one ends, except that when the first one
// ends and debug logging is on, it reads one element of the others to
// tell whether they are longer.
func Zip(datasets []Dataset, opts ...ZipOption) Dataset {
	if len(datasets) == 0 {
		return invalid("Zip: no datasets")
	}
	for i, ds := range datasets {
		if ds == nil {
			return invalid("Zip: dataset %d is nil", i)
		}
		if err := Err(ds); err != nil {
			return failed{err}
		}
	}
	cfg := zipConfig{log: zap.NewNop()}
	for _, o := range opts {
		o.applyZip(&cfg)
	}
	return &zipDS{in: slices.Clone(datasets), cfg: cfg}
}

type zipDS struct {
	in  []Dataset
	cfg zipConfig
}

func (d *zipDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *zipDS) input() Dataset                                 { return nil }
func (d *zipDS) withInput(Dataset) node                         { return d }
func (d *zipDS) inputs() []Dataset                              { return slices.Clone(d.in) }
func (d *zipDS) withInputs(ins []Dataset) node                  { return &zipDS{in: ins, cfg: d.cfg} }
func (d *zipDS) opName() string                                 { return "Zip" }
func (d *zipDS) open(ctx context.Context) (hostIter, error) {
	ups, err := openHosts(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &zipIter{d: d, ups: ups}, nil
}

// openHosts starts every one of dss, or none.
func openHosts(ctx context.Context, dss []Dataset) ([]hostIter, error) {
	var ups []hostIter
	for _, ds := range dss {
		up, err := openHost(ctx, ds)
		if err != nil {
			_ = closeHosts(ups)
			return nil, err
		}
		ups = append(ups, up)
	}
	return ups, nil
}

type zipIter struct {
	d    *zipDS
	ups  []hostIter
	part []namedColumn // the values of the element being joined, from the inputs before next
	from int           // the input to read next for it
	org  origin
	n    int64
	s    sticky
}

func (it *zipIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for ; it.from < len(it.ups); it.from++ {
		e, err := it.ups[it.from].next(ctx)
		if err == io.EOF {
			return hostElem{}, it.end(ctx)
		}
		if err != nil {
			return hostElem{}, it.s.fail(ctx, err) // a caller's deadline keeps part: the next call goes on
		}
		if it.from == 0 {
			it.org = e.origin
		}
		it.part = append(it.part, e.cols...)
	}
	out := hostElem{cols: it.part, origin: it.org}
	it.part, it.from = nil, 0
	slices.SortFunc(out.cols, func(a, b namedColumn) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(out.cols); i++ {
		if out.cols[i].name == out.cols[i-1].name {
			it.s.err = fmt.Errorf("dataset: Zip: %w: more than one dataset has a value named %q, expected distinct names", ErrInvalidArgument, out.cols[i].name)
			return hostElem{}, it.s.err
		}
	}
	it.n++
	return out, nil
}

// end ends the pass when input it.from has ended, logging when the inputs
// had different lengths.
func (it *zipIter) end(ctx context.Context) error {
	it.s.err = io.EOF
	if it.from > 0 || it.d.cfg.log.Core().Enabled(zap.DebugLevel) && it.othersHaveMore(ctx) {
		it.d.cfg.log.Debug("dataset: Zip stopped at the shortest input",
			zap.Int("ended", it.from), zap.Int64("elements", it.n), zap.Int("inputs", len(it.ups)))
	}
	return io.EOF
}

// othersHaveMore reports whether an input after the first still had an
// element when the first ended.
func (it *zipIter) othersHaveMore(ctx context.Context) bool {
	for _, up := range it.ups[1:] {
		if _, err := up.next(ctx); err == nil {
			return true
		}
	}
	return false
}

func (it *zipIter) close() error { return closeHosts(it.ups) }

// closeHosts closes every one of ups and returns the first error.
func closeHosts(ups []hostIter) error {
	var first error
	for _, up := range ups {
		if err := up.close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// IndexKey is the name of the value Enumerate adds: the element's position
// as a scalar int64.
const IndexKey = "index"

// Enumerate returns ds with each element's position, counted from start,
// added as the scalar int64 IndexKey, as tf.data's enumerate(start) pairs
// them; an element that already has a value of that name is an error.
func Enumerate(ds Dataset, start int64) Dataset {
	return newMap(ds, "Enumerate", func(i int64, e hostElem) (hostElem, error) {
		if _, ok := e.get(IndexKey); ok {
			return hostElem{}, fmt.Errorf("%w: the element already has a value named %q", ErrInvalidArgument, IndexKey)
		}
		idx := namedColumn{IndexKey, column{dtype: tf.Int64, data: []int64{start + i}}}
		cols := append(slices.Clone(e.cols), idx)
		slices.SortFunc(cols, func(a, b namedColumn) int { return strings.Compare(a.name, b.name) })
		return hostElem{cols: cols, origin: e.origin}, nil
	}, nil)
}
