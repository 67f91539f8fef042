package train

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// engine runs a Trainer's steps the way one kind of strategy does: the
// synchronous strategies step through a distributed dataset, the
// parameter-server strategy schedules steps on its workers.
type engine interface {
	strategy() Strategy
	isChief() bool
	close() error
	build(spec strategy.InputSpec, fn strategy.ReplicaFn) (any, error)
	// feed returns the training input of one Fit.
	feed(ds dataset.Dataset, stepsPerEpoch int) (feed, error)
	// evaluate runs step on every batch of ds (at most steps when steps >
	// 0) and hands each step's logs to each, in order.
	evaluate(ctx context.Context, step any, ds dataset.Dataset, steps int, each func([]float64) error) error
	// predict runs step on every batch of ds (at most steps) and returns
	// the predictions of each batch, in the data's order.
	predict(ctx context.Context, step any, ds dataset.Dataset, steps int) ([]*tf.Tensor, error)
}

// feed is the training input of one Fit.
type feed interface {
	// chunk is how many steps one run should be given.
	chunk() int
	// startEpoch begins an epoch.
	startEpoch(ctx context.Context) error
	// run runs up to n steps of step, handing each step's logs to each in
	// order (nil for a micro-step that only accumulated gradients), and
	// returns how many ran: fewer than n when the epoch's input ended.
	run(ctx context.Context, step any, n int, each func(logs []float64) error) (int, error)
	// skip moves the input to at in the epoch that follows epochs
	// passes, where a resumed run goes on.
	skip(ctx context.Context, epochs int, at position) error
	close() error
}

// position is where in its epoch a run resumes: after step steps, which
// trained examples examples.
type position struct{ step, examples int }

// syncEngine runs on a synchronous strategy.
type syncEngine struct{ s strategy.Strategy }

func (e *syncEngine) strategy() Strategy { return e.s }

func (e *syncEngine) isChief() bool {
	if c, ok := e.s.(interface{ IsChief() bool }); ok {
		return c.IsChief()
	}
	return true
}

func (e *syncEngine) close() error { return nil }

func (e *syncEngine) build(spec strategy.InputSpec, fn strategy.ReplicaFn) (any, error) {
	return e.s.Build(spec, fn)
}

func (e *syncEngine) feed(ds dataset.Dataset, stepsPerEpoch int) (feed, error) {
	return e.syncFeed(ds, stepsPerEpoch)
}

func (e *syncEngine) syncFeed(ds dataset.Dataset, stepsPerEpoch int) (*syncFeed, error) {
	dist, err := e.s.DistributeDataset(ds)
	if err != nil {
		return nil, err
	}
	return &syncFeed{e: e, dist: dist, spe: stepsPerEpoch}, nil
}

// logsOf returns the reduced logs of one step's result.
func logsOf(res strategy.Result) ([]float64, error) {
	return logValues(res.Reduced(logsOutput))
}

// microStep reports whether res is of a run of st that only accumulated
// gradients (strategy.WithAccumulation): such a run does not communicate,
// so it has no reduced outputs, and no logs; the applying run's logs
// cover it.
func microStep(st strategy.Step, res strategy.Result) bool {
	return st.Accumulation() > 1 && res.Reduced(logsOutput) == nil
}

// logValues returns the float32 logs vector of a step as float64s.
func logValues(t *tf.Tensor) ([]float64, error) {
	f := []float32(nil)
	if t != nil {
		f = tensorutil.Float32s(t)
	}
	if f == nil {
		return nil, errors.New("the step has no float32 logs output")
	}
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out, nil
}

func (e *syncEngine) evaluate(ctx context.Context, step any, ds dataset.Dataset, steps int, each func([]float64) error) error {
	dist, err := e.s.DistributeDataset(ds)
	if err != nil {
		return err
	}
	n := 0
	for b, err := range dist.All(ctx) {
		if err != nil {
			return fmt.Errorf("batch %d: %w", n, err)
		}
		if steps > 0 && n == steps {
			break
		}
		res, err := e.s.Run(ctx, step.(strategy.Step), b)
		if err != nil {
			return fmt.Errorf("batch %d: %w", n, err)
		}
		logs, err := logsOf(res)
		if err != nil {
			return err
		}
		if err := each(logs); err != nil {
			return err
		}
		n++
	}
	return nil
}

// predict gathers each batch's predictions from every replica of every
// worker. Over several workers the data is sharded by BATCH — each global
// batch split among every replica in order — so the gathered rows come
// in the data's order.
func (e *syncEngine) predict(ctx context.Context, step any, ds dataset.Dataset, steps int) ([]*tf.Tensor, error) {
	ictx := e.s.InputContext()
	workers := ictx.NumInputPipelines
	var opts []dataset.DistributeOption
	if workers > 1 {
		opts = append(opts, dataset.WithShardPolicy(dataset.ShardBatch))
	}
	dist, err := e.s.DistributeDataset(ds, opts...)
	if err != nil {
		return nil, err
	}
	var out []*tf.Tensor
	for b, err := range dist.All(ctx) {
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", len(out), err)
		}
		if steps > 0 && len(out) == steps {
			break
		}
		res, err := e.s.Run(ctx, step.(strategy.Step), b)
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", len(out), err)
		}
		var t *tf.Tensor
		if workers == 1 {
			t, err = concatRows(e.s.LocalResults(res[predOutput]))
		} else {
			t, err = e.s.Gather(ctx, res[predOutput])
		}
		if err != nil {
			return nil, fmt.Errorf("batch %d: %w", len(out), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// concatRows concatenates tensors of one type along their first axis.
func concatRows(ts []*tf.Tensor) (*tf.Tensor, error) {
	if len(ts) == 0 {
		return nil, errors.New("no predictions")
	}
	var buf bytes.Buffer
	rows := int64(0)
	for _, t := range ts {
		if t.DataType() != ts[0].DataType() || len(t.Shape()) == 0 || len(t.Shape()) != len(ts[0].Shape()) {
			return nil, fmt.Errorf("predictions of type %v shape %v and %v shape %v do not concatenate", ts[0].DataType(), ts[0].Shape(), t.DataType(), t.Shape())
		}
		if _, err := t.WriteContentsTo(&buf); err != nil {
			return nil, err
		}
		rows += t.Shape()[0]
	}
	shape := append([]int64{rows}, ts[0].Shape()[1:]...)
	return tf.ReadTensor(ts[0].DataType(), shape, bytes.NewReader(buf.Bytes()))
}

// syncFeed steps through a distributed dataset: a pass per epoch, or,
// with steps per epoch, one pass after another across epochs.
type syncFeed struct {
	e    *syncEngine
	dist *dataset.Distributed
	spe  int
	it   *dataset.DistIterator
}

func (f *syncFeed) chunk() int { return 1 }

func (f *syncFeed) startEpoch(ctx context.Context) error {
	if f.it != nil && f.spe > 0 {
		return nil
	}
	return f.reopen(ctx)
}

func (f *syncFeed) reopen(ctx context.Context) error {
	if f.it != nil {
		f.it.Close()
	}
	var err error
	f.it, err = f.dist.Iterator(ctx)
	return err
}

// next returns the next batch of the epoch, or io.EOF at its end; with
// steps per epoch, a pass that ends starts the next.
func (f *syncFeed) next(ctx context.Context) (*dataset.Batch, error) {
	b, err := f.it.Next(ctx)
	if err == io.EOF && f.spe > 0 {
		if err := f.reopen(ctx); err != nil {
			return nil, err
		}
		if b, err = f.it.Next(ctx); err == io.EOF {
			return nil, errors.New("the training data is empty")
		}
	}
	return b, err
}

func (f *syncFeed) run(ctx context.Context, step any, n int, each func([]float64) error) (int, error) {
	for i := range n {
		b, err := f.next(ctx)
		if err == io.EOF {
			return i, nil
		}
		if err != nil {
			return i, err
		}
		st := step.(strategy.Step)
		res, err := f.e.s.Run(ctx, st, b)
		if err != nil {
			return i, err
		}
		logs, err := logsOf(res)
		if err != nil && !microStep(st, res) {
			return i, err
		}
		if err := each(logs); err != nil {
			return i + 1, err
		}
	}
	return n, nil
}

// skip passes over the batches a resumed run has trained on: whole passes
// (each opened and closed, so that a reshuffling pipeline's next pass has
// the order it had) and the steps of the current epoch.
func (f *syncFeed) skip(ctx context.Context, epochs int, at position) error {
	drop := at.step
	if f.spe > 0 {
		drop += epochs * f.spe
	} else {
		for range epochs {
			if err := f.reopen(ctx); err != nil {
				return err
			}
		}
	}
	if err := f.startEpoch(ctx); err != nil {
		return err
	}
	for i := range drop {
		b, err := f.next(ctx)
		if err == io.EOF {
			return fmt.Errorf("resuming at step %d of epoch %d: the epoch's data ended after %d steps", at.step, epochs, i)
		}
		if err != nil {
			return err
		}
		if b.NeedsAgreement() {
			return fmt.Errorf("resuming at step %d of epoch %d: the workers' inputs may end at different steps (FILE sharding), so a step cannot be skipped; use DATA sharding or back up at epoch ends", at.step, epochs)
		}
	}
	return nil
}

func (f *syncFeed) close() error {
	if f.it != nil {
		return f.it.Close()
	}
	return nil
}
