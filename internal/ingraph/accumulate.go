package ingraph

import (
	"context"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// Gradient accumulation (WithAccumulation) on the in-graph engine.
//
// A step that accumulates k micro-steps is built with two sets of targets in
// the same graph, and each run picks one by the engine's micro-step count,
// kept in Go: a micro-step that only accumulates adds each replica's
// gradients, scaled by the run's loss divisor, to accumulators on the
// replica's device, and adds the run's examples to a count — no
// collective runs; the micro-step that applies adds its own gradients to
// the accumulated ones in-graph, all-reduces the sums together with the
// count (one BatchReduce, so one pack when the CrossDeviceOps packs),
// divides by the count, applies, and zeroes the accumulators. Since a
// gradient of AverageLoss times its divisor is the sum of the replica's
// per-example gradients, the update is the gradient of the mean loss over
// every example of the k micro-steps, whatever their sizes.
//
// The accumulators, the count and the micro-step count are variables of
// the strategy (OnRead, summed across replicas; the micro-step count takes
// replica 0's), so checkpoints save and restore a half-accumulated update;
// a restore makes the next run read the micro-step count again.

// Names of the variables that hold the accumulation state.
const (
	accumOwner       = "accumulation"
	accumStepsName   = "micro_steps"
	accumExamples    = "examples"
	accumGradient    = "gradient"
	accumOutputsSlot = "outputs/"
)

// accumState is the engine's accumulation state, shared by every step
// that accumulates. e.mu guards it.
type accumState struct {
	k        int   // micro-steps per update; 0 until a step that accumulates is built
	micro    int64 // micro-steps accumulated since the last update, when known
	known    bool  // micro matches the variable steps
	steps    *variable
	examples *variable
	read     tf.Output // steps' copy 0
}

// accumulation returns the engine's accumulation state for a step that
// accumulates k micro-steps, creating its variables on first use. e.mu is
// held.
func (e *Engine) accumulation(k int) (*accumState, error) {
	if e.accum == nil {
		steps, err := e.slotVariable(slotKey{owner: accumOwner, slot: accumStepsName}, accumOwner+"/"+accumStepsName, tf.Int64, nil, strategy.Zeros(),
			strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationOnlyFirstReplica))
		if err != nil {
			return nil, err
		}
		examples, err := e.slotVariable(slotKey{owner: accumOwner, slot: accumExamples}, accumOwner+"/"+accumExamples, tf.Float, nil, strategy.Zeros(),
			strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum))
		if err != nil {
			return nil, err
		}
		s := e.namespace("accumulation_read").WithDevice(e.cfg.Devices[0])
		e.accum = &accumState{steps: steps, examples: examples, read: op.ReadVariableOp(s, steps.handles[0], tf.Int64)}
		if err := s.Err(); err != nil {
			return nil, err
		}
	}
	if a := e.accum; a.k != 0 && a.k != k {
		return nil, fmt.Errorf("WithAccumulation(%d): the strategy has a step that accumulates %d micro-steps, and the steps of a strategy share one accumulation state", k, a.k)
	}
	return e.accum, nil
}

// forgetMicroSteps makes the next run read the micro-step count from its
// variable: after a restore or an Assign from outside. e.mu is held.
func (e *Engine) forgetMicroSteps() {
	if e.accum != nil {
		e.accum.known = false
	}
}

// applies reports whether the next run of a step that accumulates is the
// micro-step that applies. e.mu is held.
func (a *accumState) applies(ctx context.Context, e *Engine) (bool, error) {
	if !a.known {
		out, err := e.runLocked(ctx, nil, []tf.Output{a.read}, nil)
		if err != nil {
			return false, fmt.Errorf("strategy: read the micro-steps accumulated: %w", err)
		}
		a.micro, a.known = tensorutil.Value(out[0]).(int64), true
	}
	return a.micro+1 >= int64(a.k), nil
}

// ran records the outcome of a run: after an error the accumulated state
// is read again before the next run.
func (a *accumState) ran(applied bool, err error) {
	switch {
	case err != nil:
		a.known = false
	case applied:
		a.micro = 0
	default:
		a.micro++
	}
}

// accumBuild collects what accumulation adds to a step while Build traces
// it; every replica context of the build shares one.
type accumBuild struct {
	k            int             // micro-steps per update: 0 until a Minimize, then its WithAccumulation
	divisors     []tf.Output     // per replica: the divisor of AverageLoss in this run
	weights      []tf.Output     // per replica: the examples this run adds to the count
	communicates []string        // the step's cross-replica calls that communicate in every run
	micro        []*tf.Operation // run by a micro-step that only accumulates
	apply        []*tf.Operation // run by the micro-step that applies
	accs         []*variable     // accumulators the applying run zeroes
	counts       []tf.Output     // per replica: the examples accumulated, this run's included
}

// use records that a Minimize of the step accumulates k micro-steps (1:
// none), and returns an error when another Minimize gave another k.
func (ab *accumBuild) use(k int) error {
	if ab.k != 0 && ab.k != k {
		return fmt.Errorf("WithAccumulation(%d) where another Minimize of the step has WithAccumulation(%d); a step accumulates all its gradients or none", k, ab.k)
	}
	ab.k = k
	return nil
}

// accumulates reports whether the step accumulates gradients.
func (ab *accumBuild) accumulates() bool { return ab.k > 1 }

// reduceGradients sums the replicas' gradients of vars, vals[r][i]: with
// the CrossDeviceOps, or, in a step that accumulates, with
// reduceAccumulated, which averages them over the accumulated examples.
func (e *Engine) reduceGradients(s *op.Scope, ab *accumBuild, vars []*variable, vals [][]tf.Output) ([][]tf.Output, error) {
	switch gr := e.cfg.GradientReducer; {
	case !ab.accumulates() && gr != nil:
		return gr.ReduceGradients(s, vals, e.cfg.Devices)
	case !ab.accumulates():
		return e.cfg.CrossDeviceOps.BatchReduce(s, strategy.Sum, vals, e.cfg.Devices)
	case gr != nil:
		return nil, fmt.Errorf("WithAccumulation(%d): the strategy's aggregation rule combines each step's gradients as they are; it cannot accumulate them", ab.k)
	}
	accs, err := e.gradientAccumulators(ab, vars)
	if err != nil {
		return nil, err
	}
	return e.reduceAccumulated(s, ab, accs, vals)
}

// gradientAccumulators returns the accumulators of vars' gradients, whole
// and one copy a replica, for a step being built.
func (e *Engine) gradientAccumulators(ab *accumBuild, vars []*variable) ([]*variable, error) {
	accs := make([]*variable, len(vars))
	for i, v := range vars {
		a, err := e.accumulator(ab, slotKey{owner: accumOwner, v: v, slot: accumGradient}, accumulatorName(v), v.dtype, v.shape)
		if err != nil {
			return nil, err
		}
		accs[i] = a
	}
	return accs, nil
}

// accumulator returns the accumulator that key names, of dtype and shape,
// for a step being built, and returns an error if the step already uses it.
func (e *Engine) accumulator(ab *accumBuild, key slotKey, name string, dtype tf.DataType, shape []int64) (*variable, error) {
	if _, err := e.accumulation(ab.k); err != nil {
		return nil, err
	}
	v, err := e.slotVariable(key, name, dtype, shape, strategy.Zeros(), strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum))
	if err != nil {
		return nil, err
	}
	for _, a := range ab.accs {
		if a == v {
			return nil, fmt.Errorf("accumulator %q is used twice in one step: give each variable to one Minimize", name)
		}
	}
	ab.accs = append(ab.accs, v)
	return v, nil
}

// reduceAccumulated is BatchReduce(Sum) for a step that accumulates: value
// k of replica r, vals[r][k], is accumulated into accs[k]. A micro-step that
// only accumulates adds vals times the loss divisor to the replica's copy;
// the applying run reduces copy + vals × divisor across replicas together
// with the example count, and returns the sums divided by the count.
func (e *Engine) reduceAccumulated(s *op.Scope, ab *accumBuild, accs []*variable, vals [][]tf.Output) ([][]tf.Output, error) {
	totals := e.accumulatedTotals(s, ab, accs, vals)
	for r := range vals {
		totals[r] = append(totals[r], e.accumulatedCount(ab, r))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	sums, err := e.cfg.CrossDeviceOps.BatchReduce(s.SubScope("all_reduce"), strategy.Sum, totals, e.cfg.Devices)
	if err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(vals))
	for r := range vals {
		rs := s.SubScope(fmt.Sprintf("average_%d", r)).WithDevice(e.cfg.Devices[r])
		count := sums[r][len(accs)]
		for k, a := range accs {
			ks := rs.SubScope(fmt.Sprintf("value_%d", k))
			out[r] = append(out[r], op.DivNoNan(ks, sums[r][k], graphutil.CastTo(ks.SubScope("count"), count, a.dtype)))
		}
	}
	return out, s.Err()
}

// accumulatedTotals returns, per replica r and value k, the accumulator
// accs[k]'s copy r plus vals[r][k] times the run's loss divisor, the sum
// the applying run reduces; a micro-step that only accumulates adds the
// scaled value to the copy (ab.micro).
func (e *Engine) accumulatedTotals(s *op.Scope, ab *accumBuild, accs []*variable, vals [][]tf.Output) [][]tf.Output {
	totals := make([][]tf.Output, len(vals))
	for r := range vals {
		rs := s.SubScope(fmt.Sprintf("accumulate_%d", r)).WithDevice(e.cfg.Devices[r])
		for k, a := range accs {
			ks := rs.SubScope(fmt.Sprintf("value_%d", k))
			scaled := e.scaled(ks, ab, r, vals[r][k])
			ab.micro = append(ab.micro, op.AssignAddVariableOp(ks.SubScope("add"), a.handles[r], scaled))
			totals[r] = append(totals[r], op.AddV2(ks.SubScope("total"), op.ReadVariableOp(ks.SubScope("read"), a.handles[r], a.dtype), scaled))
		}
	}
	return totals
}

// scaled returns replica r's value x times the run's loss divisor: the
// sum of x over the replica's examples, for a gradient of AverageLoss.
func (e *Engine) scaled(s *op.Scope, ab *accumBuild, r int, x tf.Output) tf.Output {
	return op.Mul(s.SubScope("scaled"), x, graphutil.CastTo(s.SubScope("divisor"), ab.divisors[r], x.DataType()))
}

// accumulatedCount returns replica r's examples accumulated so far plus
// this run's, built once per step.
func (e *Engine) accumulatedCount(ab *accumBuild, r int) tf.Output {
	if ab.counts == nil {
		ab.counts = make([]tf.Output, len(e.cfg.Devices))
	}
	if ab.counts[r].Op == nil {
		s := e.namespace("accumulated_examples").WithDevice(e.cfg.Devices[r])
		ex := e.accum.examples
		ab.counts[r] = op.AddV2(s, op.ReadVariableOp(s.SubScope("read"), ex.handles[r], tf.Float), ab.weights[r])
	}
	return ab.counts[r]
}

// stepAccum is what a built step that accumulates runs besides its own
// targets.
type stepAccum struct {
	microTargets []*tf.Operation // a micro-step that only accumulates
	applyTargets []*tf.Operation // the micro-step that applies
	globals      []tf.Output     // per replica: the loss divisor, fed when the engine spans workers
	k            int
}

// finishAccumulation completes a step that accumulates: a micro-step also
// counts its examples and itself, and the applying run, once everything
// else it runs is done, zeroes every accumulator, the count and the
// micro-step count. Cross-replica calls that communicate in every run are
// a build error, since micro-steps do not communicate.
func (e *Engine) finishAccumulation(root *op.Scope, st *step, ab *accumBuild, globals []tf.Output) error {
	if !ab.accumulates() {
		return nil
	}
	if len(ab.communicates) > 0 {
		return &strategy.BuildError{Replica: -1, Err: fmt.Errorf("%s in a step with WithAccumulation(%d): a micro-step that accumulates does not communicate; "+
			"only Minimize, ApplyGradients and ReduceOutput combine replicas in such a step", ab.communicates[0], ab.k)}
	}
	a := e.accum
	ab.apply = uniqueOps(ab.apply)
	s := root.SubScope("accumulation")
	reset := append(append([]*variable(nil), ab.accs...), a.examples, a.steps)
	var zeroes []*tf.Operation
	for r, dev := range e.cfg.Devices {
		rs := s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(dev)
		ab.micro = append(ab.micro, op.AssignAddVariableOp(rs.SubScope("count"), a.examples.handles[r], ab.weights[r]),
			op.AssignAddVariableOp(rs.SubScope("step"), a.steps.handles[r], op.Const(rs.SubScope("one"), int64(1))))
		zs := rs.SubScope("reset").WithControlDependencies(ab.apply...)
		for i, v := range reset {
			vs := zs.SubScope(fmt.Sprintf("var_%d", i))
			zero, err := strategy.Zeros().Build(vs.SubScope("zero"), v.dtype, v.localShape())
			if err != nil {
				return &strategy.BuildError{Replica: -1, Err: err}
			}
			zeroes = append(zeroes, op.AssignVariableOp(vs, v.handles[r], zero))
		}
	}
	if err := s.Err(); err != nil {
		return &strategy.BuildError{Replica: -1, Err: fmt.Errorf("accumulation: %w", err)}
	}
	st.acc = &stepAccum{
		k:            ab.k,
		microTargets: append(append([]*tf.Operation(nil), st.targets...), ab.micro...),
		applyTargets: append(append(append([]*tf.Operation(nil), st.targets...), ab.apply...), zeroes...),
		globals:      globals,
	}
	a.k = ab.k
	return nil
}

// runPlan returns what a run of st fetches and runs, and whether it
// applies an update: the whole step, or for a step that accumulates, the
// micro-step that the engine's micro-step count calls for. e.mu is held.
func (e *Engine) runPlan(ctx context.Context, st *step) ([]tf.Output, []*tf.Operation, bool, error) {
	if st.acc == nil {
		return st.fetches, st.targets, true, nil
	}
	applies, err := e.accum.applies(ctx, e)
	switch {
	case err != nil:
		return nil, nil, false, err
	case applies:
		return st.fetches, st.acc.applyTargets, true, nil
	}
	return st.fetches[:len(st.outNames)*len(e.cfg.Devices)], st.acc.microTargets, false, nil
}

// Accumulation returns the number of runs (micro-steps) whose gradients
// one update of the step applies: its WithAccumulation, or 1.
func (st *step) Accumulation() int {
	if st.acc == nil {
		return 1
	}
	return st.acc.k
}
