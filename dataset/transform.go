package dataset

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// MapOption configures Map and ParseExamples.
type MapOption interface{ applyMap(*mapConfig) }

type mapConfig struct{ parallelism int }

type parallelismOption int

func (p parallelismOption) applyMap(c *mapConfig) { c.parallelism = int(p) }

// WithParallelism runs the function on n goroutines (default 1: on the
// caller's goroutine). Results keep their input order, so a pipeline stays
// deterministic. n < 1 means runtime.GOMAXPROCS(0).
func WithParallelism(n int) MapOption {
	if n < 1 {
		n = runtime.GOMAXPROCS(0)
	}
	return parallelismOption(n)
}

// Map returns a dataset of fn applied to every element of ds. fn must be safe
// for concurrent use when the parallelism is above 1. An error from fn ends
// the pass with that error, wrapped with the element's index; a panic in fn
// is returned as an error too.
func Map(ds Dataset, fn func(Element) (Element, error), opts ...MapOption) Dataset {
	if fn == nil {
		return invalid("Map: nil function")
	}
	return newMap(ds, "Map", func(i int64, e hostElem) (hostElem, error) {
		out, err := applyTo(fn, e)
		if err != nil {
			return hostElem{}, fmt.Errorf("dataset: Map: element %d: %w", i, err)
		}
		he, err := elemFromTensors(out)
		if err != nil {
			return hostElem{}, fmt.Errorf("dataset: Map: element %d: %w", i, err)
		}
		he.origin = e.origin
		return he, nil
	}, opts)
}

func newMap(ds Dataset, what string, fn hostFn, opts []MapOption) Dataset {
	if ds == nil {
		return invalid("%s: nil Dataset", what)
	}
	cfg := mapConfig{parallelism: 1}
	for _, o := range opts {
		o.applyMap(&cfg)
	}
	return &mapDS{in: ds, fn: fn, what: what, parallelism: cfg.parallelism}
}

type mapDS struct {
	in          Dataset
	fn          hostFn
	what        string
	parallelism int
}

func (d *mapDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *mapDS) input() Dataset                                 { return d.in }
func (d *mapDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *mapDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	if d.parallelism <= 1 {
		return &seqMapIter{up: up, fn: d.fn, what: d.what}, nil
	}
	return newParallelMapIter(ctx, up, d.what, d.fn, d.parallelism), nil
}

// Filter returns the elements of ds for which keep returns true. An error from
// keep ends the pass.
func Filter(ds Dataset, keep func(Element) (bool, error)) Dataset {
	if ds == nil || keep == nil {
		return invalid("Filter: nil Dataset or function")
	}
	return &filterDS{in: ds, keep: keep}
}

type filterDS struct {
	in   Dataset
	keep func(Element) (bool, error)
}

func (d *filterDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *filterDS) input() Dataset                                 { return d.in }
func (d *filterDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *filterDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &filterIter{up: up, keep: d.keep}, nil
}

type filterIter struct {
	up   hostIter
	keep func(Element) (bool, error)
	i    int64
	s    sticky
}

func (it *filterIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for {
		e, err := it.up.next(ctx)
		if err != nil {
			return hostElem{}, it.s.fail(ctx, err)
		}
		i := it.i
		it.i++
		keep, err := applyTo(it.keep, e)
		if err != nil {
			return hostElem{}, it.s.fail(ctx, fmt.Errorf("dataset: Filter: element %d: %w", i, err))
		}
		if keep {
			return e, nil
		}
		if err := ctx.Err(); err != nil {
			return hostElem{}, err
		}
	}
}

func (it *filterIter) close() error { return it.up.close() }

// ShuffleOption configures Shuffle.
type ShuffleOption interface{ applyShuffle(*shuffleDS) }

type shuffleOptionFunc func(*shuffleDS)

func (f shuffleOptionFunc) applyShuffle(d *shuffleDS) { f(d) }

// WithReshuffleEachIteration sets whether each pass over the shuffled dataset
// uses a new order (default true, as in tf.data). Pass p (counting from 0,
// per dataset value) shuffles with a seed derived from the seed and p, so
// the sequence of orders is the same in every run and every process.
func WithReshuffleEachIteration(reshuffle bool) ShuffleOption {
	return shuffleOptionFunc(func(d *shuffleDS) { d.reshuffle = reshuffle })
}

// Shuffle returns ds in a random order drawn with a buffer of buffer
// elements: the buffer is filled, and each step yields a uniformly chosen
// buffered element and refills its slot, as tf.data's shuffle does. A buffer
// at least the size of the dataset gives a uniform permutation.
//
// The order depends only on seed, the pass number and the order of ds:
// identical in every run and in every process, on every platform (the
// generator is this package's own, not math/rand). Workers that shard by DATA
// rely on this.
func Shuffle(ds Dataset, buffer int, seed uint64, opts ...ShuffleOption) Dataset {
	if ds == nil {
		return invalid("Shuffle: nil Dataset")
	}
	if buffer < 1 {
		return invalid("Shuffle: buffer %d, expected at least 1", buffer)
	}
	d := &shuffleDS{in: ds, buffer: buffer, seed: seed, reshuffle: true, passes: new(atomic.Uint64)}
	for _, o := range opts {
		o.applyShuffle(d)
	}
	return d
}

type shuffleDS struct {
	in        Dataset
	buffer    int
	seed      uint64
	reshuffle bool
	passes    *atomic.Uint64
}

func (d *shuffleDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *shuffleDS) input() Dataset                                 { return d.in }
func (d *shuffleDS) withInput(in Dataset) node {
	c := *d
	c.in = in
	c.passes = new(atomic.Uint64)
	return &c
}
func (d *shuffleDS) open(ctx context.Context) (hostIter, error) {
	pass := d.passes.Add(1) - 1
	if !d.reshuffle {
		pass = 0
	}
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &shuffleIter{up: up, size: d.buffer, rng: newRNG(d.seed, pass)}, nil
}

type shuffleIter struct {
	up     hostIter
	size   int
	rng    rng
	buf    []hostElem
	upDone bool
	s      sticky
}

func (it *shuffleIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for !it.upDone && len(it.buf) < it.size {
		e, err := it.up.next(ctx)
		if err == io.EOF {
			it.upDone = true
			break
		}
		if err != nil {
			return hostElem{}, it.s.fail(ctx, err)
		}
		it.buf = append(it.buf, e)
	}
	if len(it.buf) == 0 {
		it.s.err = io.EOF
		return hostElem{}, io.EOF
	}
	i := it.rng.intN(len(it.buf))
	e := it.buf[i]
	last := len(it.buf) - 1
	it.buf[i] = it.buf[last]
	it.buf[last] = hostElem{}
	it.buf = it.buf[:last]
	return e, nil
}

func (it *shuffleIter) close() error { it.buf = nil; return it.up.close() }

// Repeat returns ds repeated count times, or forever when count < 0. Each
// repetition is a new pass over ds (and so, after Shuffle, a new order). A
// repetition that yields no element ends the dataset, so repeating an empty
// dataset forever ends instead of spinning.
func Repeat(ds Dataset, count int) Dataset {
	if ds == nil {
		return invalid("Repeat: nil Dataset")
	}
	return &repeatDS{in: ds, count: count}
}

type repeatDS struct {
	in    Dataset
	count int
}

func (d *repeatDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *repeatDS) input() Dataset                                 { return d.in }
func (d *repeatDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *repeatDS) open(ctx context.Context) (hostIter, error) {
	return &repeatIter{d: d, life: ctx}, nil
}

type repeatIter struct {
	d    *repeatDS
	life context.Context // bounds the passes this iterator opens
	cur  hostIter
	done int
	saw  bool
	s    sticky
}

func (it *repeatIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for {
		if it.cur == nil {
			if it.d.count >= 0 && it.done >= it.d.count {
				it.s.err = io.EOF
				return hostElem{}, io.EOF
			}
			up, err := openHost(it.life, it.d.in)
			if err != nil {
				return hostElem{}, it.s.fail(ctx, err)
			}
			it.cur, it.saw = up, false
		}
		e, err := it.cur.next(ctx)
		if err == nil {
			it.saw = true
			return e, nil
		}
		if err != io.EOF {
			return hostElem{}, it.s.fail(ctx, err)
		}
		cerr := it.cur.close()
		it.cur = nil
		it.done++
		if cerr != nil {
			return hostElem{}, it.s.fail(ctx, cerr)
		}
		if !it.saw {
			it.s.err = io.EOF
			return hostElem{}, io.EOF
		}
	}
}

func (it *repeatIter) close() error {
	if it.cur == nil {
		return nil
	}
	err := it.cur.close()
	it.cur = nil
	return err
}

// Batched returns ds with size consecutive elements stacked into each
// element: every value gains a leading dimension of size. All elements of a
// batch must have the same names, dtypes and shapes. The last batch holds
// what remains (fewer than size) unless dropRemainder is set, in which case
// it is dropped.
//
// (tf.data calls this batch; the name Batch belongs to the per-step value of
// a distributed dataset.)
func Batched(ds Dataset, size int, dropRemainder bool) Dataset {
	if ds == nil {
		return invalid("Batched: nil Dataset")
	}
	if size < 1 {
		return invalid("Batched: size %d, expected at least 1", size)
	}
	return &batchDS{in: ds, size: size, drop: dropRemainder}
}

type batchDS struct {
	in   Dataset
	size int
	drop bool
}

func (d *batchDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *batchDS) input() Dataset                                 { return d.in }
func (d *batchDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *batchDS) batchSize() int                                 { return d.size }
func (d *batchDS) resized(n int) node                             { c := *d; c.size = n; return &c }
func (d *batchDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &batchIter{up: up, size: d.size, drop: d.drop, what: "Batched", stack: stack}, nil
}

// batchIter groups size elements at a time and combines them with stack.
type batchIter struct {
	up      hostIter
	size    int
	drop    bool
	what    string
	stack   func([]hostElem) (hostElem, error)
	pending []hostElem
	n       int64 // batches returned
	s       sticky
}

func (it *batchIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	for len(it.pending) < it.size {
		e, err := it.up.next(ctx)
		if err == io.EOF {
			it.s.err = io.EOF
			if len(it.pending) == 0 || it.drop {
				it.pending = nil
				return hostElem{}, io.EOF
			}
			break
		}
		if err != nil {
			return hostElem{}, it.s.fail(ctx, err)
		}
		it.pending = append(it.pending, e)
	}
	out, err := it.stack(it.pending)
	if err == nil {
		out.loans = gatherLoans(it.pending) // the batch's rows may still lie in them
	}
	clear(it.pending)
	it.pending = it.pending[:0]
	if err != nil {
		it.s.err = fmt.Errorf("dataset: %s: batch %d: %w", it.what, it.n, err)
		return hostElem{}, it.s.err
	}
	it.n++
	return out, nil
}

func (it *batchIter) close() error { it.pending = nil; return it.up.close() }

// stack stacks elements of identical structure along a new first dimension.
func stack(elems []hostElem) (hostElem, error) {
	first := elems[0]
	out := hostElem{cols: make([]namedColumn, len(first.cols)), origin: first.origin}
	for i, e := range elems[1:] {
		if !sameNames(e.cols, first.cols) {
			return hostElem{}, fmt.Errorf("%w: element %d holds {%s}, expected {%s} like element 0",
				ErrShape, i+1, describe(e.cols), describe(first.cols))
		}
	}
	for j, c0 := range first.cols {
		name := c0.name
		k, err := kindFor(c0.dtype)
		if err != nil {
			return hostElem{}, fmt.Errorf("feature %q: %w", name, err)
		}
		rowSize := int(numElements(c0.shape))
		parts := make([]any, len(elems))
		for i, e := range elems {
			c := e.cols[j]
			if c.dtype != c0.dtype || !slices.Equal(c.shape, c0.shape) {
				return hostElem{}, fmt.Errorf("%w: feature %q of element %d is %s%v, expected %s%v like element 0%s",
					ErrShape, name, i, graphutil.DTypeName(c.dtype), c.shape, graphutil.DTypeName(c0.dtype), c0.shape, at(e.origin))
			}
			d, err := c.view()
			if err != nil {
				return hostElem{}, fmt.Errorf("feature %q of element %d: %w", name, i, err)
			}
			parts[i] = d
		}
		data := joinRows(k, parts, len(elems)*rowSize, rowSize)
		shape := make([]int64, 0, len(c0.shape)+1)
		shape = append(shape, int64(len(elems)))
		shape = append(shape, c0.shape...)
		out.cols[j] = namedColumn{name, column{dtype: c0.dtype, shape: shape, data: data}}
	}
	return out, nil
}

func at(o origin) string {
	if o.file == "" {
		return ""
	}
	return " (" + o.String() + ")"
}

// Take returns the first n elements of ds (all of them when n < 0).
func Take(ds Dataset, n int) Dataset {
	if ds == nil {
		return invalid("Take: nil Dataset")
	}
	return &takeDS{in: ds, n: n}
}

type takeDS struct {
	in Dataset
	n  int
}

func (d *takeDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *takeDS) input() Dataset                                 { return d.in }
func (d *takeDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *takeDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &takeIter{up: up, left: d.n}, nil
}

type takeIter struct {
	up   hostIter
	left int
}

func (it *takeIter) next(ctx context.Context) (hostElem, error) {
	if it.left == 0 {
		return hostElem{}, io.EOF
	}
	e, err := it.up.next(ctx)
	if err == nil && it.left > 0 {
		it.left--
	}
	return e, err
}

func (it *takeIter) close() error { return it.up.close() }

// Skip returns ds without its first n elements (without any when n < 0).
func Skip(ds Dataset, n int) Dataset {
	if ds == nil {
		return invalid("Skip: nil Dataset")
	}
	return &skipDS{in: ds, n: n}
}

type skipDS struct {
	in Dataset
	n  int
}

func (d *skipDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *skipDS) input() Dataset                                 { return d.in }
func (d *skipDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *skipDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &skipIter{up: up, left: d.n}, nil
}

type skipIter struct {
	up   hostIter
	left int
}

func (it *skipIter) next(ctx context.Context) (hostElem, error) {
	for it.left != 0 {
		if _, err := it.up.next(ctx); err != nil {
			return hostElem{}, err
		}
		if it.left > 0 {
			it.left--
		}
	}
	return it.up.next(ctx)
}

func (it *skipIter) close() error { return it.up.close() }

// Shard returns the elements i of ds with i mod n == index: the DATA
// sharding of one input pipeline among n. Every pipeline reads all of ds and
// keeps its share, so ds must yield the same order in every pipeline (seed
// any Shuffle before the shard).
func Shard(ds Dataset, n, index int) Dataset {
	if ds == nil {
		return invalid("Shard: nil Dataset")
	}
	if n < 1 || index < 0 || index >= n {
		return invalid("Shard: index %d of %d shards, expected 0 <= index < shards", index, n)
	}
	return &shardDS{in: ds, n: n, index: index}
}

type shardDS struct {
	in       Dataset
	n, index int
}

func (d *shardDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *shardDS) input() Dataset                                 { return d.in }
func (d *shardDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *shardDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &shardIter{up: up, n: d.n, index: d.index}, nil
}

type shardIter struct {
	up       hostIter
	n, index int
	i        int
}

func (it *shardIter) next(ctx context.Context) (hostElem, error) {
	for {
		e, err := it.up.next(ctx)
		if err != nil {
			return hostElem{}, err
		}
		i := it.i
		it.i++
		if i%it.n == it.index {
			return e, nil
		}
	}
}

func (it *shardIter) close() error { return it.up.close() }

// Prefetch returns ds read ahead by a goroutine into a buffer of n elements,
// so that producing the next elements overlaps with consuming the current
// one. The buffer is bounded: at most n elements wait, plus one being
// produced. n < 1 means 1.
func Prefetch(ds Dataset, n int) Dataset {
	if ds == nil {
		return invalid("Prefetch: nil Dataset")
	}
	return &prefetchDS{in: ds, n: max(n, 1)}
}

type prefetchDS struct {
	in Dataset
	n  int
}

func (d *prefetchDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *prefetchDS) input() Dataset                                 { return d.in }
func (d *prefetchDS) withInput(in Dataset) node                      { c := *d; c.in = in; return &c }
func (d *prefetchDS) open(ctx context.Context) (hostIter, error) {
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return newPumpIter(ctx, up, d.n), nil
}

// Cache returns ds kept in memory after its first complete pass: later passes
// replay the cached elements without reading ds. A first pass closed before
// its end caches nothing (the next pass reads ds again), so the cache never
// holds a partial epoch.
func Cache(ds Dataset) Dataset {
	if ds == nil {
		return invalid("Cache: nil Dataset")
	}
	return &cacheDS{in: ds, c: new(cacheState)}
}

type cacheState struct {
	mu    sync.Mutex
	done  bool
	elems []hostElem
}

type cacheDS struct {
	in Dataset
	c  *cacheState
}

func (d *cacheDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *cacheDS) input() Dataset                                 { return d.in }
func (d *cacheDS) withInput(in Dataset) node                      { return &cacheDS{in: in, c: new(cacheState)} }
func (d *cacheDS) open(ctx context.Context) (hostIter, error) {
	d.c.mu.Lock()
	done, elems := d.c.done, d.c.elems
	d.c.mu.Unlock()
	if done {
		return &replayIter{elems: elems}, nil
	}
	up, err := openHost(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &fillIter{up: up, c: d.c}, nil
}

type replayIter struct {
	elems []hostElem
	i     int
}

func (it *replayIter) next(context.Context) (hostElem, error) {
	if it.i >= len(it.elems) {
		return hostElem{}, io.EOF
	}
	it.i++
	return it.elems[it.i-1], nil
}

func (it *replayIter) close() error { return nil }

type fillIter struct {
	up    hostIter
	c     *cacheState
	elems []hostElem
	s     sticky
}

func (it *fillIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	e, err := it.up.next(ctx)
	if err == io.EOF {
		it.c.mu.Lock()
		if !it.c.done {
			it.c.done, it.c.elems = true, it.elems
		}
		it.c.mu.Unlock()
		it.elems = nil
	}
	if err != nil {
		return hostElem{}, it.s.fail(ctx, err)
	}
	// Cache host values, so replays neither hold nor re-read tensors.
	he, err := hostCopy(e)
	if err != nil {
		return hostElem{}, it.s.fail(ctx, fmt.Errorf("dataset: Cache: %w", err))
	}
	it.elems = append(it.elems, he)
	return he, nil
}

// hostCopy returns e with every value in Go memory, for stages that hold
// elements across passes (Cache, PoissonSample).
func hostCopy(e hostElem) (hostElem, error) {
	he := hostElem{cols: make([]namedColumn, len(e.cols)), origin: e.origin}
	for j, c := range e.cols {
		h, err := c.host()
		if err != nil {
			return hostElem{}, fmt.Errorf("feature %q: %w", c.name, err)
		}
		he.cols[j] = namedColumn{c.name, h}
	}
	return he, nil
}

func (it *fillIter) close() error { it.elems = nil; return it.up.close() }
