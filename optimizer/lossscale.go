package optimizer

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// LossScale is dynamic loss scaling around another optimizer, as Keras'
// LossScaleOptimizer: it keeps float16 gradients from underflowing under
// the mixed_float16 policy (nn.MixedFloat16). Replica.Minimize multiplies
// the loss by the current scale before differentiating it (LossScale is a
// strategy.LossScaler); Apply divides the all-reduced gradients by the
// scale and, if every one is finite, applies the inner optimizer. A step
// with an infinite or NaN gradient is skipped — no variable, slot or step
// count of the inner optimizer moves — and the scale is multiplied by the
// backoff factor; after GrowthInterval finite steps in a row it is
// multiplied by the growth factor. Every replica of a synchronous
// strategy decides from the same all-reduced gradients, so all skip the
// same steps.
//
// The scale ("LossScale/scale", float32) and the count of finite steps
// since it last changed ("LossScale/good_steps", int64) are variables of
// the strategy, saved in checkpoints. LossScale must be the optimizer
// given to Minimize, not wrapped in another one: wrap gradient clipping
// inside it, so that it clips unscaled gradients (Keras sets clipping on
// the inner optimizer too). The parameter-server strategy refuses it.
type LossScale struct {
	inner strategy.Optimizer
	cfg   lossScaleConfig
	// scaled counts the losses scaled whose gradients Apply has not yet
	// been given: Apply refuses gradients of a loss that was not scaled.
	scaled atomic.Int64
}

var _ strategy.LossScaler = (*LossScale)(nil)

type lossScaleConfig struct {
	initial, growth, backoff float64
	interval                 int64
}

// LossScaleOption configures NewLossScale.
type LossScaleOption func(*lossScaleConfig)

// WithInitialScale sets the scale of the first step (default 2^15).
func WithInitialScale(s float64) LossScaleOption {
	return func(c *lossScaleConfig) { c.initial = s }
}

// WithGrowthInterval sets the number of finite steps in a row after which
// the scale grows (default 2000).
func WithGrowthInterval(steps int64) LossScaleOption {
	return func(c *lossScaleConfig) { c.interval = steps }
}

// WithGrowthFactor sets the factor the scale grows by (default 2).
func WithGrowthFactor(f float64) LossScaleOption {
	return func(c *lossScaleConfig) { c.growth = f }
}

// WithBackoffFactor sets the factor the scale is multiplied by after a
// step with non-finite gradients (default 0.5).
func WithBackoffFactor(f float64) LossScaleOption {
	return func(c *lossScaleConfig) { c.backoff = f }
}

const lossScaleName = "LossScale"

// NewLossScale returns inner with dynamic loss scaling, with Keras'
// defaults: an initial scale of 2^15, growth by 2 after 2000 finite
// steps, backoff by 0.5. A fixed scale has growth and backoff factors of
// 1; a fixed scale of 1 trains without loss scaling (non-finite steps are
// still skipped).
func NewLossScale(inner strategy.Optimizer, opts ...LossScaleOption) (*LossScale, error) {
	if inner == nil {
		return nil, errors.New("NewLossScale: nil inner optimizer")
	}
	c := lossScaleConfig{initial: 1 << 15, interval: 2000, growth: 2, backoff: 0.5}
	for _, o := range opts {
		o(&c)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(c.initial) || c.initial <= 0 || c.initial > math.MaxFloat32:
		return nil, fmt.Errorf("NewLossScale: initial scale %v, expected a finite float32 > 0", c.initial)
	case c.interval < 1:
		return nil, fmt.Errorf("NewLossScale: growth interval %d, expected at least 1 step", c.interval)
	case !finite(c.growth) || c.growth < 1:
		return nil, fmt.Errorf("NewLossScale: growth factor %v, expected a finite factor >= 1", c.growth)
	case !(c.backoff > 0 && c.backoff <= 1):
		return nil, fmt.Errorf("NewLossScale: backoff factor %v, expected 0 < backoff <= 1", c.backoff)
	}
	return &LossScale{inner: inner, cfg: c}, nil
}

// Inner returns the optimizer LossScale wraps.
func (o *LossScale) Inner() strategy.Optimizer { return o.inner }

// state returns the scale and good-steps variables, created on first use.
func (o *LossScale) state(ac strategy.ApplyContext) (scale, good strategy.Variable, err error) {
	init, err := tf.NewTensor(float32(o.cfg.initial))
	if err != nil {
		return nil, nil, err
	}
	if scale, err = ac.NonSlot(lossScaleName, "scale", tf.Float, nil, strategy.Constant(init)); err != nil {
		return nil, nil, err
	}
	good, err = ac.NonSlot(lossScaleName, "good_steps", tf.Int64, nil, strategy.Zeros())
	return scale, good, err
}

// LossScale implements strategy.LossScaler: it reads the current scale.
func (o *LossScale) LossScale(ac strategy.ApplyContext) (tf.Output, error) {
	scale, _, err := o.state(ac)
	if err != nil {
		return tf.Output{}, err
	}
	s := ac.Scope().SubScope(lossScaleName + "_factor")
	f := op.ReadVariableOp(s, ac.Handle(scale), tf.Float)
	if err := s.Err(); err != nil {
		return tf.Output{}, err
	}
	o.scaled.Add(1)
	return f, nil
}

// Apply implements strategy.Optimizer: it unscales grads, applies the
// inner optimizer if all are finite, and updates the scale.
func (o *LossScale) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if o.scaled.Add(-1) < 0 {
		o.scaled.Add(1)
		return nil, errors.New("LossScale: gradients of a loss that was not scaled: give the LossScale optimizer itself to Replica.Minimize, not wrapped in another optimizer nor to ApplyGradients")
	}
	if err := checkGrads(grads, vars); err != nil {
		return nil, err
	}
	scaleVar, goodVar, err := o.state(ac)
	if err != nil {
		return nil, err
	}
	s := ac.Scope().SubScope(lossScaleName)
	scale := op.ReadVariableOp(s.SubScope("scale"), ac.Handle(scaleVar), tf.Float)
	good := op.ReadVariableOp(s.SubScope("good_steps"), ac.Handle(goodVar), tf.Int64)
	finite, unscaled := unscale(s.SubScope("unscale"), scale, grads)
	if finite, err = everywhere(ac, s.SubScope("everywhere"), finite); err != nil {
		return nil, err
	}
	// Every op of the inner update takes the gradients through a Switch,
	// so on a non-finite step TensorFlow marks them dead and runs none.
	applied := make([]tf.Output, len(grads))
	for i, g := range unscaled {
		_, applied[i] = op.Switch(s.SubScope(fmt.Sprintf("guard_%d", i)), g, finite)
	}
	innerOp, err := o.inner.Apply(ac, applied, vars)
	if err != nil {
		return nil, err
	}
	updates := o.updateScale(s.SubScope("update"), ac, scaleVar, goodVar, scale, good, finite)
	done := op.NoOp(s.SubScope("done").WithControlDependencies(append(updates, joined(s.SubScope("join"), innerOp, finite))...))
	return done, s.Err()
}

// unscale returns whether every gradient is finite and the gradients
// divided by scale.
func unscale(s *op.Scope, scale tf.Output, grads []tf.Output) (tf.Output, []tf.Output) {
	alls := make([]tf.Output, len(grads))
	out := make([]tf.Output, len(grads))
	for i, g := range grads {
		gs := s.SubScope(fmt.Sprintf("grad_%d", i))
		alls[i] = op.All(gs.SubScope("all"), op.IsFinite(gs.SubScope("is_finite"), g), allAxes(gs, g))
		out[i] = op.RealDiv(gs.SubScope("div"), g, graphutil.CastTo(gs, scale, g.DataType()))
	}
	finite := op.All(s.SubScope("all"), op.Pack(s.SubScope("finite"), alls), op.Const(s.SubScope("axis"), int32(0)))
	return finite, out
}

// everywhere returns whether finite holds for the shards of every worker
// (strategy.ShardedApply), so that all skip a step together: finite itself
// unless ac addresses shards.
func everywhere(ac strategy.ApplyContext, s *op.Scope, finite tf.Output) (tf.Output, error) {
	if _, ok := ac.(strategy.ShardedApply); !ok {
		return finite, nil
	}
	bad := op.Cast(s.SubScope("bad"), op.LogicalNot(s.SubScope("not"), finite), tf.Float)
	total, err := acrossShards(ac, s, bad)
	if err != nil {
		return tf.Output{}, err
	}
	return op.Equal(s.SubScope("none"), total, op.Const(s.SubScope("zero"), float32(0))), nil
}

// allAxes returns the axes of every dimension of x: a reduction over them
// gives a scalar.
func allAxes(s *op.Scope, x tf.Output) tf.Output {
	return op.Range(s.SubScope("axes"), op.Const(s.SubScope("start"), int32(0)), op.Rank(s.SubScope("rank"), x), op.Const(s.SubScope("delta"), int32(1)))
}

// updateScale assigns the next scale and good-step count: on a finite
// step the count grows, or, when it reaches the interval, resets and the
// scale grows; on a non-finite step the count resets and the scale backs
// off (Keras' LossScaleOptimizer).
func (o *LossScale) updateScale(s *op.Scope, ac strategy.ApplyContext, scaleVar, goodVar strategy.Variable, scale, good, finite tf.Output) []*tf.Operation {
	grow := op.LogicalAnd(s.SubScope("grow"), finite,
		op.GreaterEqual(s.SubScope("due"), good, op.Const(s.SubScope("interval"), o.cfg.interval-1)))
	f32 := func(name string, v float64) tf.Output { return op.Const(s.SubScope(name), float32(v)) }
	factor := op.Select(s.SubScope("factor"), finite,
		op.Select(s.SubScope("grow_factor"), grow, f32("growth", o.cfg.growth), f32("one", 1)), f32("backoff", o.cfg.backoff))
	zero := op.Const(s.SubScope("zero"), int64(0))
	next := op.Select(s.SubScope("next_good"), op.LogicalAnd(s.SubScope("count"), finite, op.LogicalNot(s.SubScope("not_grow"), grow)),
		op.AddV2(s.SubScope("inc"), good, op.Const(s.SubScope("one_step"), int64(1))), zero)
	return []*tf.Operation{
		op.AssignVariableOp(s.SubScope("assign_scale"), ac.Handle(scaleVar), op.Mul(s.SubScope("next_scale"), scale, factor)),
		op.AssignVariableOp(s.SubScope("assign_good"), ac.Handle(goodVar), next),
	}
}

// joined returns an op that runs once inner has run or been skipped:
// inner is dead (TensorFlow's control flow) when finite is false, and a
// step's targets must not be.
func joined(s *op.Scope, inner *tf.Operation, finite tf.Output) *tf.Operation {
	ran := op.Identity(s.SubScope("ran").WithControlDependencies(inner), finite)
	skipped, _ := op.Switch(s.SubScope("skipped"), finite, finite)
	out, _ := op.Merge(s.SubScope("merge"), []tf.Output{ran, skipped})
	return out.Op
}
