// Package testmodel trains the digits MLP under any strategy engine with
// explicit per-replica feeds, for the equivalence tests of the strategies.
package testmodel

import (
	"context"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/tensorutil"
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
	per := gb / total
	var out Outcome
	for k := range steps {
		start := (k * gb) % (d.Len() - gb)
		feeds := make([]map[string]*tf.Tensor, n)
		for r := range n {
			lo := start + (firstReplica+r)*per
			x, err := tf.NewTensor(d.X[lo : lo+per])
			if err != nil {
				return out, err
			}
			y, err := tf.NewTensor(d.Y[lo : lo+per])
			if err != nil {
				return out, err
			}
			feeds[r] = map[string]*tf.Tensor{"x": x, "y": y}
		}
		res, err := e.RunReplicas(ctx, step, feeds, gb)
		if err != nil {
			return out, fmt.Errorf("step %d: %w", k, err)
		}
		l, err := e.Reduce(ctx, strategy.Sum, res["loss"])
		if err != nil {
			return out, err
		}
		out.FinalLoss = float64(l.Value().(float32))
	}
	out.Params = map[string][]float32{}
	var l2 float64
	for _, v := range m.Vars() {
		t, err := e.Value(ctx, v)
		if err != nil {
			return out, err
		}
		flat := tensorutil.Float32s(t)
		out.Params[v.Name()] = flat
		for _, f := range flat {
			l2 += float64(f) * float64(f)
		}
	}
	out.ParamL2 = math.Sqrt(l2)
	return out, nil
}

// RelDiff is |a-b| / max(|a|, |b|, tiny).
func RelDiff(a, b float64) float64 {
	d := math.Abs(a - b)
	m := math.Max(math.Max(math.Abs(a), math.Abs(b)), 1e-12)
	return d / m
}
