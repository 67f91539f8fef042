package dataset

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
)

// PoissonSample returns steps batches drawn from the examples of ds by
// Poisson sampling, as DP-SGD's privacy accounting (package accountant)
// assumes: each batch holds every example of ds independently with
// probability rate, in ds's order, so its size varies around rate × the
// number of examples and may be 0 (its tensors then have a first dimension
// of 0). Batch k is drawn by this package's generator seeded with seed and
// k: the same in every pass, run and process, so that workers sharding by
// DATA each keep their share of the same batch. ds is read once, on the
// first pass, and its examples are held in memory.
//
// Shuffled fixed-size batches (Shuffle, then Batched) give each example a
// fixed place in every epoch; they are not Poisson samples, and the
// accountant's ε does not hold for them.
func PoissonSample(ds Dataset, rate float64, steps int, seed uint64) Dataset {
	switch {
	case ds == nil:
		return invalid("PoissonSample: nil Dataset")
	case !(rate > 0 && rate <= 1):
		return invalid("PoissonSample: sampling rate %v, expected a rate in (0, 1]", rate)
	case steps < 0:
		return invalid("PoissonSample: %d steps, expected 0 or more", steps)
	}
	return &poissonDS{in: ds, rate: rate, steps: steps, seed: seed, pop: new(population)}
}

type poissonDS struct {
	in    Dataset
	rate  float64
	steps int
	seed  uint64
	pop   *population
}

// population holds the examples a poissonDS samples from, read once.
type population struct {
	mu    sync.Mutex
	done  bool
	elems []hostElem
}

func (d *poissonDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *poissonDS) input() Dataset                                 { return d.in }
func (d *poissonDS) withInput(in Dataset) node {
	c := *d
	c.in, c.pop = in, new(population)
	return &c
}

func (d *poissonDS) open(ctx context.Context) (hostIter, error) {
	elems, err := d.pop.load(ctx, d.in)
	if err != nil {
		return nil, err
	}
	return &poissonIter{d: d, elems: elems}, nil
}

// load reads every example of in, once.
func (p *population) load(ctx context.Context, in Dataset) ([]hostElem, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return p.elems, nil
	}
	up, err := openHost(ctx, in)
	if err != nil {
		return nil, err
	}
	defer up.close()
	var elems []hostElem
	for {
		e, err := up.next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		he, err := hostCopy(e)
		if err != nil {
			return nil, fmt.Errorf("dataset: PoissonSample: %w", err)
		}
		elems = append(elems, he)
	}
	if len(elems) == 0 {
		return nil, fmt.Errorf("dataset: PoissonSample: %w: the dataset has no examples to sample from", ErrInvalidArgument)
	}
	p.done, p.elems = true, elems
	return elems, nil
}

type poissonIter struct {
	d     *poissonDS
	elems []hostElem
	step  int
}

func (it *poissonIter) next(ctx context.Context) (hostElem, error) {
	if it.step >= it.d.steps {
		return hostElem{}, io.EOF
	}
	if err := ctx.Err(); err != nil {
		return hostElem{}, err
	}
	idx := poissonIndices(newRNG(it.d.seed, uint64(it.step)), len(it.elems), it.d.rate)
	it.step++
	if len(idx) == 0 {
		return emptyBatch(it.elems[0])
	}
	picked := make([]hostElem, len(idx))
	for i, j := range idx {
		picked[i] = it.elems[j]
	}
	out, err := stack(picked)
	if err != nil {
		return hostElem{}, fmt.Errorf("dataset: PoissonSample: batch %d: %w", it.step-1, err)
	}
	return out, nil
}

func (it *poissonIter) close() error { it.elems = nil; return nil }

// poissonIndices returns the indices in [0, n) that each make it into the
// sample with probability rate, in increasing order: the gaps between
// them are geometric, so a draw costs O(rate × n).
func poissonIndices(r rng, n int, rate float64) []int {
	if rate == 1 {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	var idx []int
	logKeep := math.Log1p(-rate)
	for i := -1; ; {
		u := 1 - r.float64() // in (0, 1]
		gap := math.Floor(math.Log(u) / logKeep)
		if gap >= float64(n-i) {
			return idx
		}
		i += 1 + int(gap)
		if i >= n {
			return idx
		}
		idx = append(idx, i)
	}
}

// emptyBatch returns a batch of no examples shaped like example.
func emptyBatch(example hostElem) (hostElem, error) {
	out := hostElem{cols: make([]namedColumn, len(example.cols)), origin: example.origin}
	for j, c := range example.cols {
		k, err := kindFor(c.dtype)
		if err != nil {
			return hostElem{}, fmt.Errorf("dataset: PoissonSample: feature %q: %w", c.name, err)
		}
		shape := append([]int64{0}, c.shape...)
		out.cols[j] = namedColumn{c.name, column{dtype: c.dtype, shape: shape, data: k.concat(nil, 0)}}
	}
	return out, nil
}
