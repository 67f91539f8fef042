package dataset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/tfdist/tfdist/internal/graphutil"
	tf "github.com/wamuir/graft/tensorflow"
)

// Element is one element of a dataset: named tensors. Before batching each
// tensor is one example's value (for example "x" float32 [64], "y" int32
// scalar); after Batched, each gains a leading batch dimension ("x" [B, 64],
// "y" [B]). Treat the tensors as read-only: a dataset may hand the same
// tensor to more than one pass.
type Element map[string]*tf.Tensor

// Dataset is a re-iterable source of elements. Each call to Iterator starts a
// new pass over the data.
//
// The constructors and transformations of this package return Datasets that
// keep values in Go memory between stages and create tensors only at the end
// of the pipeline. Any other implementation plugs in as well; its elements
// are read through its Iterator.
type Dataset interface {
	// Iterator starts a pass. ctx bounds the lifetime of any goroutine the
	// pass starts (prefetching, parallel map): cancelling it ends the pass.
	Iterator(ctx context.Context) (Iterator, error)
}

// Iterator yields the elements of one pass over a Dataset. An Iterator is not
// safe for concurrent use.
type Iterator interface {
	// Next returns the next element, or io.EOF after the last. It honours
	// ctx while it waits. After Next returns an error other than ctx's own,
	// the pass is over and every later call returns the same error.
	Next(ctx context.Context) (Element, error)
	// Close ends the pass early and releases its goroutines and files. It
	// may be called at any time, more than once.
	Close() error
}

// RecordKey is the name of the value of the elements of TFRecordFiles: the
// record as a scalar string tensor.
const RecordKey = "record"

// origin locates the record an element came from, for error messages.
type origin struct {
	file   string
	offset int64
}

func (o origin) String() string {
	if o.file == "" {
		return ""
	}
	return fmt.Sprintf("%s at byte offset %d", o.file, o.offset)
}

// hostElem is an element inside a pipeline: its values sorted by name. (A
// slice rather than a map: elements are made per record, and a small map
// costs several times the allocation.)
type hostElem struct {
	cols   []namedColumn
	origin origin
	loans  []loan // buffers its values lie in, lent by a parser (see recycle.go)
}

type namedColumn struct {
	name string
	column
}

// get returns the value named name.
func (e hostElem) get(name string) (column, bool) {
	for _, c := range e.cols {
		if c.name == name {
			return c.column, true
		}
	}
	return column{}, false
}

// element returns e as tensors.
func (e hostElem) element() (Element, error) {
	out := make(Element, len(e.cols))
	for _, c := range e.cols {
		t, err := c.tensor()
		if err != nil {
			return nil, fmt.Errorf("dataset: feature %q: %w", c.name, err)
		}
		out[c.name] = t
	}
	return out, nil
}

// hostBytes returns about how much memory e's values take on the host.
func (e hostElem) hostBytes() int {
	n := 0
	for _, c := range e.cols {
		n += c.hostBytes()
	}
	return n
}

func elemFromTensors(e Element) (hostElem, error) {
	cols := make([]namedColumn, 0, len(e))
	for _, name := range slices.Sorted(maps.Keys(e)) {
		t := e[name]
		if t == nil {
			return hostElem{}, fmt.Errorf("dataset: feature %q: %w: nil tensor", name, ErrInvalidArgument)
		}
		c, err := columnFromTensor(t)
		if err != nil {
			return hostElem{}, fmt.Errorf("dataset: feature %q: %w", name, err)
		}
		cols = append(cols, namedColumn{name, c})
	}
	return hostElem{cols: cols}, nil
}

// hostIter is the iterator of the pipelines of this package.
type hostIter interface {
	next(ctx context.Context) (hostElem, error)
	close() error
}

// hostDataset is a Dataset of this package.
type hostDataset interface {
	Dataset
	open(ctx context.Context) (hostIter, error)
}

// node is a dataset of this package whose input (if any) can be replaced,
// which lets Distribute rewrite a pipeline: shard its files, resize its batch,
// give it fresh per-pass state.
type node interface {
	hostDataset
	input() Dataset            // nil for a source
	withInput(in Dataset) node // a copy reading from in, with fresh state
}

// openHost starts a pass over any Dataset.
func openHost(ctx context.Context, ds Dataset) (hostIter, error) {
	if ds == nil {
		return nil, fmt.Errorf("dataset: %w: nil Dataset", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if h, ok := ds.(hostDataset); ok {
		return h.open(ctx)
	}
	it, err := ds.Iterator(ctx)
	if err != nil {
		return nil, err
	}
	return &foreignIter{it: it}, nil
}

// foreignIter reads a Dataset implemented outside this package.
type foreignIter struct{ it Iterator }

func (f *foreignIter) next(ctx context.Context) (hostElem, error) {
	e, err := f.it.Next(ctx)
	if err != nil {
		return hostElem{}, err
	}
	return elemFromTensors(e)
}

func (f *foreignIter) close() error { return f.it.Close() }

// iterate implements Dataset.Iterator for the datasets of this package.
func iterate(ctx context.Context, d hostDataset) (Iterator, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h, err := d.open(ctx)
	if err != nil {
		return nil, err
	}
	return &elemIter{h: h}, nil
}

// elemIter turns a pipeline's elements into tensors.
type elemIter struct {
	h      hostIter
	closed bool
}

func (it *elemIter) Next(ctx context.Context) (Element, error) {
	if it.closed {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e, err := it.h.next(ctx)
	if err != nil {
		return nil, err
	}
	return e.emit()
}

func (it *elemIter) Close() error {
	if it.closed {
		return nil
	}
	it.closed = true
	return it.h.close()
}

var errClosed = errors.New("dataset: iterator closed")

// sticky remembers the error that ended a pass. The caller's own context
// errors do not end it: Next may be called again with a live context.
type sticky struct{ err error }

func (s *sticky) fail(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	s.err = err
	return err
}

// failed is a Dataset whose every pass fails with err: what a transformation
// given invalid arguments returns, so the mistake surfaces at Iterator and
// Distribute instead of as a panic.
type failed struct{ err error }

func (f failed) Iterator(ctx context.Context) (Iterator, error) { return nil, f.err }
func (f failed) open(ctx context.Context) (hostIter, error)     { return nil, f.err }
func (f failed) input() Dataset                                 { return nil }
func (f failed) withInput(Dataset) node                         { return f }

func invalid(format string, args ...any) Dataset {
	return failed{fmt.Errorf("dataset: %w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))}
}

// Err reports whether ds, or any dataset it reads from, was built with
// invalid arguments: the error its Iterator would return. Datasets not built
// by this package report nil.
func Err(ds Dataset) error {
	for ds != nil {
		if f, ok := ds.(failed); ok {
			return f.err
		}
		n, ok := ds.(node)
		if !ok {
			return nil
		}
		ds = n.input()
	}
	return nil
}

// All returns the elements of one pass over ds as a Go iterator. A failure
// is yielded once, with a nil Element, and ends the sequence; so does
// breaking out of the loop, which closes the pass.
func All(ctx context.Context, ds Dataset) iter.Seq2[Element, error] {
	return func(yield func(Element, error) bool) {
		it, err := ds.Iterator(ctx)
		if err != nil {
			yield(nil, err)
			return
		}
		defer it.Close()
		for {
			e, err := it.Next(ctx)
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// Collect reads one whole pass over ds.
func Collect(ctx context.Context, ds Dataset) ([]Element, error) {
	var out []Element
	for e, err := range All(ctx, ds) {
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// describe names the values of e with their dtypes and shapes, for errors.
func describe(cols []namedColumn) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s%v", c.name, graphutil.DTypeName(c.dtype), c.shape)
	}
	return b.String()
}
