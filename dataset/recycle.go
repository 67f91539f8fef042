package dataset

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"
)

// An ExampleParser lends the buffers it parses fixed-length float and
// integer features into, and the pipeline's output gives them back once it
// has copied their values into tensors, so that a steady pipeline parses
// into memory it used moments before instead of allocating each record's
// values afresh: about 3 KB a record for a 784-float image, which
// otherwise keeps Go's collector running every millisecond or two. (An
// int32 feature's values are parsed as int64 and converted: its buffer is
// only scratch, back in the pool as soon as the record is parsed.)
//
// A buffer is given back only by the holder of the last reference to it.
// The element that the parser made carries its loans through the stages
// that hand each element on once (Interleave, Prefetch, Filter, Shuffle,
// Take, Skip, Shard, Repeat, Concatenate, the map that parses); Batched
// and PaddedBatch gather their elements' loans into the batch, whose rows
// may still point into the buffers; and only the pipeline's outputs give
// them back, after the copy into tensors: an Iterator's Next, the
// per-replica batches of Distribute, and ExampleParser.Parse. Every other
// stage makes new elements, which carry no loans, so buffers whose values
// a stage keeps (Cache, Window, PoissonSample) or shares (Unbatch,
// Rebatch) are never given back and are the collector's, as without
// lending.

// minLent is the fewest values of a fixed-length feature whose buffers are
// lent: below it the bookkeeping costs about what an allocation does.
const minLent = 64

// loan is one buffer an element holds from a parser's pool.
type loan struct {
	pool *sync.Pool
	buf  any // a *[]float32 or *[]int64 of the pool's full capacity
}

// newPool returns a pool of buffers of capacity n.
func newPool[T float32 | int64](n int) *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]T, 0, n)
		return &b
	}}
}

// borrow takes a buffer from pool.
func borrow[T float32 | int64](pool *sync.Pool) *[]T { return pool.Get().(*[]T) }

// settle turns a borrowed buffer into a loan when data, a feature's parsed
// values, lies in it; a buffer the values do not use (a default, a
// conversion to int32, an error) goes back at once.
func settle[T float32 | int64](pool *sync.Pool, buf *[]T, data any, loans []loan) []loan {
	if buf == nil {
		return loans
	}
	if d, ok := data.([]T); ok && len(d) > 0 && unsafe.SliceData(d) == unsafe.SliceData(*buf) {
		return append(loans, loan{pool, buf})
	}
	pool.Put(buf)
	return loans
}

// emit returns e as tensors, for a pipeline's output, and then gives its
// loans back: the tensors hold copies of the values.
func (e hostElem) emit() (Element, error) {
	el, err := e.element()
	if err == nil {
		e.giveBack()
	}
	return el, err
}

// giveBack returns the buffers e holds to their pools. Only the last
// holder of e's values calls it, once it no longer reads them.
func (e hostElem) giveBack() {
	for _, l := range e.loans {
		if poisonLoans.Load() {
			poison(l.buf)
		}
		l.pool.Put(l.buf)
	}
}

// poisonLoans, which tests set, has giveBack overwrite each buffer it
// returns, so that a value read after its buffer went back shows at once
// rather than when a parser happens to reuse the buffer.
var poisonLoans atomic.Bool

// poison overwrites a lent buffer's whole capacity with values no parser
// wrote: NaN, or -1.
func poison(buf any) {
	switch b := buf.(type) {
	case *[]float32:
		fill((*b)[:cap(*b)], float32(math.NaN()))
	case *[]int64:
		fill((*b)[:cap(*b)], -1)
	}
}

func fill[T any](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}

// gatherLoans returns the loans of elems, which a batch of them takes
// over.
func gatherLoans(elems []hostElem) []loan {
	n := 0
	for _, e := range elems {
		n += len(e.loans)
	}
	if n == 0 {
		return nil
	}
	out := make([]loan, 0, n)
	for _, e := range elems {
		out = append(out, e.loans...)
	}
	return out
}
