package reducedtest

import (
	"context"
	"fmt"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// SumLoss wraps a step function that returns "loss" so that the loss comes
// back summed across replicas from the step's own run
// (Replica.ReduceOutput) instead of per replica.
func SumLoss(fn strategy.ReplicaFn) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		out, err := fn(r, in)
		if err != nil {
			return nil, err
		}
		loss, ok := out["loss"]
		if !ok {
			return nil, fmt.Errorf("SumLoss: the step returns no \"loss\"")
		}
		rest := strategy.Outputs{}
		for name, o := range out {
			if name != "loss" {
				rest[name] = o
			}
		}
		return rest, r.ReduceOutput("loss", strategy.Sum, loss)
	}
}

// LossTimer times the two ways a training loop gets the global loss of a
// step: summed in the step's own run, or returned per replica and summed
// by Reduce after the run.
type LossTimer struct {
	e                 Engine
	inRun, perReplica strategy.Step
	feeds             []map[string]*tf.Tensor
	global            int
	// InRun and RunReduce add up the time of each way's steps.
	InRun, RunReduce time.Duration
	// Loss is the last loss of each way.
	Loss  [2]float32
	calls int
}

// NewLossTimer builds fn, a step function that returns "loss", on e both
// ways; each step then runs on feeds, a global batch of global examples.
func NewLossTimer(e Engine, spec strategy.InputSpec, fn strategy.ReplicaFn, feeds []map[string]*tf.Tensor, global int) (*LossTimer, error) {
	inRun, err := e.Build(spec, SumLoss(fn))
	if err != nil {
		return nil, err
	}
	perReplica, err := e.Build(spec, fn)
	if err != nil {
		return nil, err
	}
	return &LossTimer{e: e, inRun: inRun, perReplica: perReplica, feeds: feeds, global: global}, nil
}

// Step runs one step each way, timing each from its run's start to the
// loss in hand; the way that goes first alternates from call to call.
func (lt *LossTimer) Step(ctx context.Context) error {
	ways := []func(context.Context) error{lt.stepInRun, lt.stepRunReduce}
	if lt.calls%2 == 1 {
		ways[0], ways[1] = ways[1], ways[0]
	}
	lt.calls++
	for _, way := range ways {
		if err := way(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (lt *LossTimer) stepInRun(ctx context.Context) error {
	start := time.Now()
	res, err := lt.e.RunReplicas(ctx, lt.inRun, lt.feeds, lt.global)
	if err != nil {
		return err
	}
	lt.Loss[0] = tensorutil.Value(res.Reduced("loss")).(float32)
	lt.InRun += time.Since(start)
	return nil
}

func (lt *LossTimer) stepRunReduce(ctx context.Context) error {
	start := time.Now()
	res, err := lt.e.RunReplicas(ctx, lt.perReplica, lt.feeds, lt.global)
	if err != nil {
		return err
	}
	sum, err := lt.e.Reduce(ctx, strategy.Sum, res["loss"])
	if err != nil {
		return err
	}
	lt.Loss[1] = tensorutil.Value(sum).(float32)
	lt.RunReduce += time.Since(start)
	return nil
}

// Reset zeroes the times, after a warm-up.
func (lt *LossTimer) Reset() { lt.InRun, lt.RunReduce = 0, 0 }
