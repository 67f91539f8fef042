// Package testmodel trains the digits models under any strategy engine with
// explicit per-replica feeds, by the training loop of package trainloop,
// for the equivalence tests of the strategies.
package testmodel

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/trainloop"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// Engine is what the tests need of a strategy.
type Engine interface {
	Scope(func(strategy.Scope) error) error
	Build(strategy.InputSpec, strategy.ReplicaFn) (strategy.Step, error)
	RunReplicas(context.Context, strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
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
	// Params holds the model's variables by name.
	Params map[string][]float32
	// Vars holds every float variable of the engine — the model's and the
	// optimizer's slots — sorted by name, for MaxVarDiff.
	Vars []strategy.VariableValue
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
	return TrainPlan(ctx, e, opt, Plan{Model: model, Steps: steps, MicroBatches: []int{gb}, FirstReplica: firstReplica})
}

// Plan says how TrainPlan trains.
type Plan struct {
	// Model names a model of package models ("mlp", "lenet").
	Model string
	// Hidden is the model's hidden units; 0 means 32.
	Hidden int
	// Steps is the number of updates.
	Steps int
	// Start is the update a run resumed from a checkpoint begins at: its
	// examples are those that update takes in a run from 0, and it
	// counts among Steps.
	Start int
	// MicroBatches are the global sizes of the runs of one update, each
	// split evenly among the replicas in sync; several make a step built
	// with strategy.WithAccumulation(len(MicroBatches)). An update takes
	// its examples in file order, so that {64, 64, 64, 64} feeds the
	// examples that {256} does.
	MicroBatches []int
	// FirstReplica is the global id of the engine's first local replica:
	// replica g of all replicas in sync takes slice g of each micro-batch.
	FirstReplica int
	// Workers, when more than 1, is the workers of an engine whose steps
	// are each worker's own (local SGD): its replicas in sync are one
	// worker's, and a run counts the worker's examples.
	Workers int
	// AfterRuns, when set, is called after Build and after every run with
	// the number of runs done (from 0, Start's runs included): to save a
	// checkpoint, or to restore one before the first run.
	AfterRuns func(done int) error
	// Poisoned are the global ids of replicas whose gradients are NaN,
	// as a faulty device's would be (models.PoisonedTrainStep).
	Poisoned []int
}

// TrainPlan trains a model of package models with opt on the digits data
// as p says. FinalLoss is the loss of the last run.
func TrainPlan(ctx context.Context, e Engine, opt strategy.Optimizer, p Plan) (Outcome, error) {
	d, err := digits.Load()
	if err != nil {
		return Outcome{}, err
	}
	var m *nn.Sequential
	if err := e.Scope(func(sc strategy.Scope) error {
		m, err = models.New(sc, p.Model, cmp.Or(p.Hidden, 32), 1)
		return err
	}); err != nil {
		return Outcome{}, err
	}
	var opts []strategy.MinimizeOption
	if len(p.MicroBatches) > 1 {
		opts = append(opts, strategy.WithAccumulation(len(p.MicroBatches)))
	}
	poisoned := func(replica int) bool { return slices.Contains(p.Poisoned, replica) }
	step, err := e.Build(Spec, models.PoisonedTrainStep(m, opt, poisoned, opts...))
	if err != nil {
		return Outcome{}, err
	}
	total, workers := 0, max(1, p.Workers)
	for _, mb := range p.MicroBatches {
		if mb%(e.NumReplicasInSync()*workers) != 0 {
			return Outcome{}, fmt.Errorf("micro-batch %d does not divide by %d replicas", mb, e.NumReplicasInSync()*workers)
		}
		total += mb
	}
	after := func(done int) error {
		if p.AfterRuns == nil {
			return nil
		}
		return p.AfterRuns(done)
	}
	if err := after(p.Start * len(p.MicroBatches)); err != nil {
		return Outcome{}, err
	}
	k := p.Start
	update := func(ctx context.Context) (res strategy.Result, err error) {
		start := (k * total) % (d.Len() - total)
		for j, mb := range p.MicroBatches {
			if res, err = runMicroBatch(ctx, e, step, d, start, mb, p.FirstReplica, workers); err != nil {
				return nil, fmt.Errorf("run %d: %w", j, err)
			}
			if err := after(k*len(p.MicroBatches) + j + 1); err != nil {
				return nil, err
			}
			start += mb
		}
		k++
		return res, nil
	}
	res, err := trainloop.Run(ctx, trainloop.Synchronous(update, e.Reduce), trainloop.Config{Start: p.Start, Steps: p.Steps, GlobalBatch: total})
	out := Outcome{FinalLoss: res.Loss}
	if err != nil {
		return out, err
	}
	err = out.readVars(ctx, e, m.Vars())
	return out, err
}

// runMicroBatch runs step on the mb examples from start, split evenly
// among the replicas in sync of every one of workers.
func runMicroBatch(ctx context.Context, e Engine, step strategy.Step, d digits.Data, start, mb, firstReplica, workers int) (strategy.Result, error) {
	per := mb / (e.NumReplicasInSync() * workers)
	feeds := make([]map[string]*tf.Tensor, e.NumLocalReplicas())
	for r := range feeds {
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
	return e.RunReplicas(ctx, step, feeds, mb/workers)
}

// readVars records the values of model, the model's variables, in Params,
// and those of every float variable of e in Vars.
func (out *Outcome) readVars(ctx context.Context, e Engine, model []strategy.Variable) error {
	vals, err := strategy.ReadVariables(ctx, e, model)
	if err != nil {
		return err
	}
	out.Params = map[string][]float32{}
	for _, v := range vals {
		out.Params[v.Name] = v.Float32
	}
	var all []strategy.Variable
	for _, v := range e.Variables() {
		if dt := v.DType(); dt == tf.Float || dt == tf.Double {
			all = append(all, v)
		}
	}
	slices.SortFunc(all, func(a, b strategy.Variable) int { return cmp.Compare(a.Name(), b.Name()) })
	out.Vars, err = strategy.ReadVariables(ctx, e, all)
	return err
}

// MaxVarDiff compares the variables of two outcomes element by element, by
// strategy.MaxDiff: the largest difference of an element, relative to
// the largest magnitude of its variable in want (a per-element relative
// difference would measure rounding noise on the elements near zero). It
// returns that difference and where it is: the variable, the element's
// index and both values, or what differs in the variables themselves. Outcomes without variables differ by +Inf.
func MaxVarDiff(want, got Outcome) (float64, string) {
	if len(want.Vars) == 0 {
		return math.Inf(1), "no variables to compare"
	}
	diff, name, i := strategy.MaxDiff(want.Vars, got.Vars)
	if name == "" && len(want.Vars) != len(got.Vars) {
		return diff, fmt.Sprintf("got %d variables %v, want %d %v", len(got.Vars), varNames(got.Vars), len(want.Vars), varNames(want.Vars))
	}
	k := slices.IndexFunc(want.Vars, func(v strategy.VariableValue) bool { return v.Name == name })
	if k < 0 {
		return diff, "no variable differs"
	}
	w, g := want.Vars[k], got.Vars[k]
	if i < 0 {
		return diff, fmt.Sprintf("variable %d: got %q of shape %v, want %q of shape %v", k, g.Name, g.Shape, w.Name, w.Shape)
	}
	return diff, fmt.Sprintf("variable %q%v element %d: got %v, want %v", name, w.Shape, i, element(g, i), element(w, i))
}

func varNames(vs []strategy.VariableValue) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

func element(v strategy.VariableValue, i int) float64 {
	if v.Float64 != nil {
		return v.Float64[i]
	}
	return float64(v.Float32[i])
}

// MaxParamDiff returns the largest absolute difference between an element
// of a variable of a and the same element in b, and the variable's name;
// +Inf when they hold different variables or shapes.
func MaxParamDiff(a, b Outcome) (float64, string) {
	var worst float64
	var at string
	for name, x := range a.Params {
		y, ok := b.Params[name]
		if !ok || len(x) != len(y) {
			return math.Inf(1), name
		}
		for i := range x {
			if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || math.IsNaN(d) {
				worst, at = d, name
			}
		}
	}
	if len(a.Params) != len(b.Params) {
		return math.Inf(1), ""
	}
	return worst, at
}

// RelDiff is |a-b| / max(|a|, |b|, tiny).
func RelDiff(a, b float64) float64 {
	d := math.Abs(a - b)
	m := math.Max(math.Max(math.Abs(a), math.Abs(b)), 1e-12)
	return d / m
}

// AccumulationCases are the micro-batches of the accumulation tests: 4 of
// 64 examples, and 64+64+40, the last one partial.
var AccumulationCases = [][]int{{64, 64, 64, 64}, {64, 64, 40}}

// OneStep returns p with each update's micro-batches as one global batch.
func OneStep(p Plan) Plan {
	total := 0
	for _, mb := range p.MicroBatches {
		total += mb
	}
	p.MicroBatches, p.AfterRuns = []int{total}, nil
	return p
}

// TrainDefault is TrainPlan on a default strategy of its own.
func TrainDefault(ctx context.Context, opt strategy.Optimizer, p Plan) (Outcome, error) {
	def, err := onedevice.New()
	if err != nil {
		return Outcome{}, err
	}
	defer def.Close()
	return TrainPlan(ctx, def, opt, p)
}
