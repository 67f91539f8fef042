package dataset

import (
	"context"
	"io"
)

// This file lets the workers of a job whose inputs may end at different
// steps end a pass together, as tf.distribute's get_next_as_optional and
// DDP's join do. Such a pass (several workers, under FILE sharding or from
// DistributeFromFunction) looks one batch ahead, so that each batch says
// whether its worker has another (HasNext); a multi-worker strategy sums
// that flag across workers in the step's own run and reports the answer
// (Agree). A worker whose input has ended while another's has not gets
// padding batches, of no examples, until the answer is that no worker has
// data: then every worker's pass ends after the same step.

// agreement is what a batch of an uneven pass carries.
type agreement struct {
	hasNext bool  // this worker has a batch after this one
	err     error // this worker's input failed after this batch
	agreed  bool  // a strategy reported the workers' answer
	anyNext bool  // some worker has a batch after this one
}

// NeedsAgreement reports whether the workers must agree, step by step, on
// whether any of them has data: the batch belongs to a pass of several
// workers whose inputs may end at different steps (FILE sharding, or
// datasets from DistributeFromFunction).
func (b *Batch) NeedsAgreement() bool { return b.agree != nil }

// HasNext reports whether this worker has a batch after this one. It is
// known only when NeedsAgreement; otherwise it reports true.
func (b *Batch) HasNext() bool { return b.agree == nil || b.agree.hasNext }

// Err returns the error this worker's input failed with right after this
// batch, in a pass whose workers must agree on its end (NeedsAgreement);
// the iterator's next call returns it too. A multi-worker strategy's Run
// does not run such a batch's step: it hands the error to every worker,
// whose step fails naming it, rather than leaving the peers to wait for
// this worker until the collective timeout.
func (b *Batch) Err() error {
	if b.agree == nil {
		return nil
	}
	return b.agree.err
}

// Agree records, once the batch's step ran, whether any worker has a batch
// after this one, as a multi-worker strategy learns it in the step's run.
// When none has, the pass ends after this batch on every worker. A pass
// whose batches no strategy answers for ends when this worker's input
// does.
func (b *Batch) Agree(anyHasNext bool) {
	if b.agree != nil {
		b.agree.agreed, b.agree.anyNext = true, anyHasNext
	}
}

// uneven reports whether d's workers may run out of input at different
// steps.
func (d *Distributed) uneven() bool {
	return d.ictx.NumInputPipelines > 1 && (d.fromFn || d.policy == ShardFile)
}

// agreedNext is Next for a pass of an uneven Distributed.
func (it *DistIterator) agreedNext(ctx context.Context) (*Batch, error) {
	if it.failed != nil {
		return nil, it.failed
	}
	if last := it.last; last != nil {
		more := last.agree.hasNext
		if last.agree.agreed {
			more = last.agree.anyNext
		}
		if !more {
			return nil, io.EOF
		}
	}
	b := it.peeked
	it.peeked = nil
	if b == nil && !it.localEnd {
		var err error
		if b, err = it.next(ctx); err == io.EOF {
			it.localEnd = true
		} else if err != nil {
			return nil, err
		}
	}
	if b == nil {
		b = it.padding()
	}
	b.agree = &agreement{}
	if !it.localEnd {
		nb, err := it.next(ctx)
		switch {
		case err == io.EOF:
			it.localEnd = true
		case err != nil && ctx.Err() == nil:
			// The batch goes out with the error, so that the strategy
			// fails every worker's step with it; the next call
			// returns it.
			b.agree.err, it.failed = err, err
		case err != nil:
			return nil, err
		default:
			it.peeked = nb
		}
	}
	b.agree.hasNext = it.peeked != nil
	it.last = b
	return b, nil
}

// padding returns a batch of no examples that follows it.last: its
// elements hold no tensors, and the strategy feeds each input with no rows.
func (it *DistIterator) padding() *Batch {
	n := it.local
	b := &Batch{Replicas: make([]Element, n), Counts: make([]int, n), Padding: true}
	for r := range b.Replicas {
		b.Replicas[r] = Element{}
	}
	if it.last != nil {
		b.Step = it.last.Step + 1
	}
	return b
}
