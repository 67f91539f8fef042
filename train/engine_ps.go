package train

import (
	"context"
	"fmt"
	"io"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// psChunk is the most steps the coordinator schedules before it joins
// them and hands their logs to the callbacks.
const psChunk = 64

// psEngine runs on the parameter-server strategy's chief: each step is
// scheduled on whichever worker is free, as model.fit does under
// ParameterServerStrategy.
type psEngine struct {
	s *paramserver.Strategy
	c *paramserver.Coordinator
}

func newPSEngine(s *paramserver.Strategy) (*psEngine, error) {
	c, err := paramserver.NewCoordinator(s)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return &psEngine{s: s, c: c}, nil
}

func (e *psEngine) strategy() Strategy { return e.s }
func (e *psEngine) isChief() bool      { return true }
func (e *psEngine) close() error       { return e.c.Done(context.Background()) }

func (e *psEngine) build(spec strategy.InputSpec, fn strategy.ReplicaFn) (any, error) {
	return e.s.Build(spec, fn)
}

// feed gives each worker its own shard of ds's batches, repeated: the
// steps of an epoch are steps per epoch batches taken by whichever
// workers are free.
func (e *psEngine) feed(ds dataset.Dataset, stepsPerEpoch int) (feed, error) {
	if stepsPerEpoch < 1 {
		return nil, fmt.Errorf("steps per epoch %d: under parameter servers the workers read their shards of the data without end, so Fit needs StepsPerEpoch (as model.fit under ParameterServerStrategy)", stepsPerEpoch)
	}
	in, err := e.c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		return dataset.Repeat(dataset.Shard(ds, ictx.NumInputPipelines, ictx.InputPipelineID), -1), nil
	})
	if err != nil {
		return nil, err
	}
	return &psFeed{e: e, in: in}, nil
}

// scheduled runs the steps in, one per input, and hands each step's
// outputs to each in order.
func (e *psEngine) scheduled(ctx context.Context, fn *paramserver.Function, ins []paramserver.Input, each func(map[string]*tf.Tensor) error) error {
	rvs := make([]*paramserver.RemoteValue, len(ins))
	for i, in := range ins {
		var err error
		if rvs[i], err = e.c.Schedule(fn, in); err != nil {
			return err
		}
	}
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		if err != nil {
			return err
		}
		if err := each(out); err != nil {
			return err
		}
	}
	return nil
}

// batches schedules a step on each batch of ds (at most steps), psChunk
// at a time, handing each step's outputs to each in the data's order.
func (e *psEngine) batches(ctx context.Context, fn *paramserver.Function, ds dataset.Dataset, steps int, each func(map[string]*tf.Tensor) error) error {
	it, err := ds.Iterator(ctx)
	if err != nil {
		return err
	}
	defer it.Close()
	n := 0
	for done := false; !done; {
		var ins []paramserver.Input
		for len(ins) < psChunk && (steps <= 0 || n < steps) {
			el, err := it.Next(ctx)
			if err == io.EOF {
				done = true
				break
			}
			if err != nil {
				return fmt.Errorf("batch %d: %w", n, err)
			}
			ins = append(ins, paramserver.Feed(el))
			n++
		}
		done = done || (steps > 0 && n >= steps)
		if err := e.scheduled(ctx, fn, ins, each); err != nil {
			return err
		}
	}
	return nil
}

func (e *psEngine) evaluate(ctx context.Context, step any, ds dataset.Dataset, steps int, each func([]float64) error) error {
	return e.batches(ctx, step.(*paramserver.Function), ds, steps, func(out map[string]*tf.Tensor) error {
		logs, err := logValues(out[logsOutput])
		if err != nil {
			return err
		}
		return each(logs)
	})
}

func (e *psEngine) predict(ctx context.Context, step any, ds dataset.Dataset, steps int) ([]*tf.Tensor, error) {
	var out []*tf.Tensor
	err := e.batches(ctx, step.(*paramserver.Function), ds, steps, func(o map[string]*tf.Tensor) error {
		out = append(out, o[predOutput])
		return nil
	})
	return out, err
}

// psFeed schedules training steps on the workers' own inputs.
type psFeed struct {
	e  *psEngine
	in *paramserver.PerWorkerDataset
}

func (f *psFeed) chunk() int                       { return psChunk }
func (f *psFeed) startEpoch(context.Context) error { return nil }
func (f *psFeed) close() error                     { return nil }

// skip does nothing: asynchronous steps have no global input order to
// resume in, and each worker's input starts afresh.
func (f *psFeed) skip(context.Context, int, position) error { return nil }

func (f *psFeed) run(ctx context.Context, step any, n int, each func([]float64) error) (int, error) {
	ins := make([]paramserver.Input, n)
	for i := range ins {
		ins[i] = f.in
	}
	ran := 0
	err := f.e.scheduled(ctx, step.(*paramserver.Function), ins, func(out map[string]*tf.Tensor) error {
		logs, err := logValues(out[logsOutput])
		if err != nil {
			return err
		}
		ran++
		return each(logs)
	})
	return ran, err
}
