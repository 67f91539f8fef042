// Package testmodel trains the digits models under any strategy engine with
// explicit per-replica feeds, by the training loop of package trainloop,
// for the equivalence tests of the strategies.
package testmodel

import (
	"context"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/trainloop"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// Engine is what the tests need of a strategy.
type Engine interface {
	Scope(func(strategy.Scope) error) error
	Build(strategy.InputSpec, strategy.ReplicaFn) (*strategy.Step, error)
	RunReplicas(context.Context, *strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
	Reduce(context.Context, strategy.ReduceOp, strategy.PerReplica) (*tf.Tensor, error)
	Value(context.Context, strategy.Variable) (*tf.Tensor, error)
	Variables() []strategy.Variable
	NumLocalReplicas() int
	NumReplicasInSync() int
}

// Spec is the digits models' input spec.
var Spec = models.Spec

// Outcome is what a training run ends with.
type Outcome struct {
	FinalLoss float64
	ParamL2   float64
	Params    map[string][]float32
}

// Train trains an MLP 64-32-10 with opt for steps global batches of gb
// examples, taken in file order from the digits data. firstReplica is the
// global id of e's first local replica: replica g of all replicas in sync
// takes slice g of each global batch.
func Train(ctx context.Context, e Engine, opt strategy.Optimizer, steps, gb, firstReplica int) (Outcome, error) {
	return TrainModel(ctx, e, "mlp", opt, steps, gb, firstReplica)
}

// TrainModel is Train for any model of package models, with 32 hidden
// units.
func TrainModel(ctx context.Context, e Engine, model string, opt strategy.Optimizer, steps, gb, firstReplica int) (Outcome, error) {
	d, err := digits.Load()
	if err != nil {
		return Outcome{}, err
	}
	var m *nn.Sequential
	if err := e.Scope(func(sc strategy.Scope) error {
		m, err = models.New(sc, model, 32, 1)
		return err
	}); err != nil {
		return Outcome{}, err
	}
	step, err := e.Build(Spec, models.TrainStep(m, opt))
	if err != nil {
		return Outcome{}, err
	}
	n, total := e.NumLocalReplicas(), e.NumReplicasInSync()
	if gb%total != 0 {
		return Outcome{}, fmt.Errorf("global batch %d does not divide by %d replicas", gb, total)
	}
	k := 0
	next := func(ctx context.Context) (strategy.Result, error) {
		feeds, err := replicaFeeds(d, k, gb, gb/total, firstReplica, n)
		if err != nil {
			return nil, err
		}
		k++
		return e.RunReplicas(ctx, step, feeds, gb)
	}
	res, err := trainloop.Run(ctx, trainloop.Synchronous(next, e.Reduce), trainloop.Config{Steps: steps, GlobalBatch: gb})
	out := Outcome{FinalLoss: res.Loss}
	if err != nil {
		return out, err
	}
	err = out.readParams(ctx, e, m.Vars())
	return out, err
}

// readParams records the values of vars and their L2 norm.
func (out *Outcome) readParams(ctx context.Context, e Engine, vars []strategy.Variable) error {
	out.Params = map[string][]float32{}
	var l2 float64
	for _, v := range vars {
		t, err := e.Value(ctx, v)
		if err != nil {
			return err
		}
		out.Params[v.Name()] = tensorutil.Float32s(t)
		l2 += tensorutil.SumSquares(out.Params[v.Name()])
	}
	out.ParamL2 = math.Sqrt(l2)
	return nil
}

// replicaFeeds returns the feeds of step k for the n local replicas from
// firstReplica on: replica g of all replicas in sync takes slice g, of per
// examples, of the k-th global batch of gb examples in file order.
func replicaFeeds(d digits.Data, k, gb, per, firstReplica, n int) ([]map[string]*tf.Tensor, error) {
	start := (k * gb) % (d.Len() - gb)
	feeds := make([]map[string]*tf.Tensor, n)
	for r := range n {
		lo := start + (firstReplica+r)*per
		x, err := tf.NewTensor(d.X[lo : lo+per])
		if err != nil {
			return nil, err
		}
		y, err := tf.NewTensor(d.Y[lo : lo+per])
		if err != nil {
			return nil, err
		}
		feeds[r] = map[string]*tf.Tensor{"x": x, "y": y}
	}
	return feeds, nil
}

// RelDiff is |a-b| / max(|a|, |b|, tiny).
func RelDiff(a, b float64) float64 {
	d := math.Abs(a - b)
	m := math.Max(math.Max(math.Abs(a), math.Abs(b)), 1e-12)
	return d / m
}
