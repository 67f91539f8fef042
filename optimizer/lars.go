package optimizer

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// LARS is layer-wise adaptive rate scaling (You, Gitman and Ginsburg, 2017)
// as the MLPerf reference implementation computes it (TensorFlow's
// LARSOptimizer): SGD with momentum m whose step for each variable w with
// gradient g is scaled by the variable's trust ratio
//
//	λ = η·‖w‖ / (‖g‖ + wd·‖w‖ + ε)    (1 if ‖w‖ or ‖g‖ is 0)
//	a = m·a + lr·λ·(g + wd·w)
//	w -= a                            (Nesterov: w -= m·a + lr·λ·(g + wd·w))
//
// A variable excluded from weight decay has wd = 0 in both formulas; one
// excluded from layer adaptation has λ = 1. By default both exclude
// DefaultExclusions, as MLPerf's ResNet excludes batch normalization and
// biases. The trust ratio is per shard under the parameter-server
// strategy.
type LARS struct {
	layerwise
}

// NewLARS returns LARS with the given schedule (Constant(0.01) if nil) and
// the MLPerf reference's defaults: momentum 0.9, weight decay 1e-4, trust
// coefficient η 0.001, epsilon 0, and DefaultExclusions excluded from both
// weight decay and layer adaptation. Options: WithMomentum, WithNesterov,
// WithTrustCoefficient, WithWeightDecay, WithEpsilon,
// ExcludeFromWeightDecay and ExcludeFromLayerAdaptation.
func NewLARS(lr Schedule, opts ...Option) (*LARS, error) {
	def := hyper{momentum: 0.9, weightDecay: 1e-4, eta: 0.001}
	lw, err := newLayerwise("LARS", lr, 0.01, def, []string{"WithMomentum", "WithNesterov", "WithTrustCoefficient"}, opts)
	if err != nil {
		return nil, err
	}
	return &LARS{lw}, nil
}

// Apply implements strategy.Optimizer.
func (o *LARS) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	return o.apply(ac, grads, vars, nil, func(u update) varUpdate {
		return func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error) {
			acc, err := o.slots(ac, v, "momentum")
			if err != nil {
				return nil, err
			}
			step, err := o.scaledGradient(ac, s, v, grads[i], graphutil.CastTo(s.SubScope("lr"), u.lr, v.DType()))
			if err != nil {
				return nil, err
			}
			return []*tf.Operation{op.ResourceApplyMomentum(s, ac.Handle(v), ac.Handle(acc[0]), constOf(s.SubScope("unit"), 1, v.DType()), step,
				constOf(s.SubScope("momentum"), o.h.momentum, v.DType()), op.ResourceApplyMomentumUseNesterov(o.h.nesterov))}, nil
		}
	})
}

// scaledGradient returns lr·λ·(g + wd·w) for v.
func (o *LARS) scaledGradient(ac strategy.ApplyContext, s *op.Scope, v strategy.Variable, g, lr tf.Output) (tf.Output, error) {
	dt := v.DType()
	wd := o.weightDecay(v)
	w := op.ReadVariableOp(s.SubScope("read"), ac.Handle(v), dt)
	scaled := lr
	if !o.noAdapt.match(v) {
		wNorm := weightNorm(ac, s.SubScope("w_norm"), v, w)
		gNorm, err := updateNorm(ac, s.SubScope("g_norm"), g)
		if err != nil {
			return tf.Output{}, err
		}
		den := op.Add(s.SubScope("den"), op.Add(s.SubScope("den_wd"), gNorm, op.Mul(s.SubScope("wd_w_norm"), constOf(s.SubScope("wd"), wd, dt), wNorm)),
			constOf(s.SubScope("epsilon"), o.h.epsilon, dt))
		ratio := op.Div(s.SubScope("trust"), op.Mul(s.SubScope("eta_w_norm"), constOf(s.SubScope("eta"), o.h.eta, dt), wNorm), den)
		scaled = op.Mul(s.SubScope("scaled_lr"), lr, guarded(s.SubScope("guard"), ratio, wNorm, gNorm))
	}
	if wd != 0 {
		g = op.Add(s.SubScope("decayed"), g, op.Mul(s.SubScope("wd_w"), constOf(s.SubScope("wd"), wd, dt), w))
	}
	return op.Mul(s.SubScope("step"), g, scaled), nil
}
