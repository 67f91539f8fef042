package dataset

import (
	"sync"
	"unsafe"
)

// An ExampleParser lends the float32 buffers it parses fixed-length float
// features into, and the pipeline's output gives them back once it has
// copied their values into tensors, so that a steady pipeline parses into
// memory it used moments before instead of allocating each record's values
// afresh: about 3 KB a record for a 784-float image, which otherwise keeps
// Go's collector running every millisecond or two.
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

// minLentFloats is the smallest fixed-length float feature whose buffers
// are lent: below it the bookkeeping costs about what an allocation does.
const minLentFloats = 64

// loan is one buffer an element holds from a parser's pool.
type loan struct {
	pool *sync.Pool
	buf  *[]float32 // its full capacity, as the pool hands it out
}

// newFloatPool returns a pool of float32 buffers of capacity n.
func newFloatPool(n int) *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]float32, 0, n)
		return &b
	}}
}

// borrow takes a buffer from pool, or nil for none.
func borrow(pool *sync.Pool) *[]float32 {
	if pool == nil {
		return nil
	}
	return pool.Get().(*[]float32)
}

// settle turns a borrowed buffer into a loan when data, a feature's parsed
// values, lies in it; a buffer the values do not use goes back at once.
func settle(pool *sync.Pool, buf *[]float32, data any, loans []loan) []loan {
	if buf == nil {
		return loans
	}
	if d, ok := data.([]float32); ok && len(d) > 0 && unsafe.SliceData(d) == unsafe.SliceData(*buf) {
		return append(loans, loan{pool, buf})
	}
	pool.Put(buf)
	return loans
}

// giveBack returns the buffers e holds to their pools. Only the last
// holder of e's values calls it, once it no longer reads them.
func (e hostElem) giveBack() {
	for _, l := range e.loans {
		l.pool.Put(l.buf)
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
