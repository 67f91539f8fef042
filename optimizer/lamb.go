package optimizer

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// LAMB is layer-wise adaptive moments (You et al., 2019) as TensorFlow
// Addons' LAMB computes it: Adam's moments of the gradient g with bias
// correction at step t (counting from 1), an update r with weight decay,
// and a trust ratio per variable w:
//
//	m = β1·m + (1-β1)·g;    v = β2·v + (1-β2)·g²
//	r = (m/(1-β1^t)) / (sqrt(v/(1-β2^t)) + ε) + wd·w
//	w -= lr·(‖w‖/‖r‖)·r                (ratio 1 if ‖w‖ or ‖r‖ is 0)
//
// A variable excluded from weight decay has wd = 0; one excluded from
// layer adaptation has ratio 1. By default both exclude
// DefaultExclusions. The trust ratio is per shard under the
// parameter-server strategy.
type LAMB struct {
	layerwise
}

// NewLAMB returns LAMB with the given schedule (Constant(0.001) if nil) and
// TensorFlow Addons' defaults: betas 0.9 and 0.999, epsilon 1e-6, weight
// decay 0; DefaultExclusions are excluded from weight decay and layer
// adaptation. Options: WithBetas, WithWeightDecay, WithEpsilon,
// ExcludeFromWeightDecay and ExcludeFromLayerAdaptation.
func NewLAMB(lr Schedule, opts ...Option) (*LAMB, error) {
	def := hyper{beta1: 0.9, beta2: 0.999, epsilon: 1e-6}
	lw, err := newLayerwise("LAMB", lr, 0.001, def, []string{"WithBetas"}, opts)
	if err != nil {
		return nil, err
	}
	return &LAMB{lw}, nil
}

// Apply implements strategy.Optimizer.
func (o *LAMB) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	return o.apply(ac, grads, vars, nil, func(u update) varUpdate {
		b1p, b2p := betaPowers(u, o.h)
		return func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error) {
			mv, err := o.slots(ac, v, "m", "v")
			if err != nil {
				return nil, err
			}
			dt := v.DType()
			m, setM := moment(s.SubScope("m"), ac.Handle(mv[0]), dt, grads[i], o.h.beta1)
			vt, setV := moment(s.SubScope("v"), ac.Handle(mv[1]), dt, op.Square(s.SubScope("g2"), grads[i]), o.h.beta2)
			r := op.Div(s.SubScope("r"), corrected(s.SubScope("m_hat"), m, b1p),
				op.Add(s.SubScope("den"), op.Sqrt(s.SubScope("sqrt"), corrected(s.SubScope("v_hat"), vt, b2p)), constOf(s.SubScope("epsilon"), o.h.epsilon, dt)))
			w := op.ReadVariableOp(s.SubScope("read"), ac.Handle(v), dt)
			if wd := o.weightDecay(v); wd != 0 {
				r = op.Add(s.SubScope("decayed"), r, op.Mul(s.SubScope("wd_w"), constOf(s.SubScope("wd"), wd, dt), w))
			}
			lr := graphutil.CastTo(s.SubScope("lr"), u.lr, dt)
			if !o.noAdapt.match(v) {
				wNorm := weightNorm(ac, s.SubScope("w_norm"), v, w)
				rNorm, err := updateNorm(ac, s.SubScope("r_norm"), r)
				if err != nil {
					return nil, err
				}
				lr = op.Mul(s.SubScope("scaled_lr"), guarded(s.SubScope("guard"), op.Div(s.SubScope("trust"), wNorm, rNorm), wNorm, rNorm), lr)
			}
			next := op.Sub(s.SubScope("next"), w, op.Mul(s.SubScope("step"), lr, r))
			return []*tf.Operation{op.AssignVariableOp(s.SubScope("assign"), ac.Handle(v), next), setM, setV}, nil
		}
	})
}

// moment returns β·moment + (1-β)·x, the next value of the moment variable
// h, and the op that assigns it.
func moment(s *op.Scope, h tf.Output, dt tf.DataType, x tf.Output, beta float32) (tf.Output, *tf.Operation) {
	old := op.ReadVariableOp(s.SubScope("read"), h, dt)
	next := op.Add(s.SubScope("next"), op.Mul(s.SubScope("decayed"), old, constOf(s.SubScope("beta"), beta, dt)),
		op.Mul(s.SubScope("new"), x, constOf(s.SubScope("one_minus_beta"), 1-beta, dt)))
	return next, op.AssignVariableOp(s.SubScope("assign"), h, next)
}

// corrected is x/(1-βᵗ), the bias-corrected moment x.
func corrected(s *op.Scope, x, betaPower tf.Output) tf.Output {
	one := op.OnesLike(s.SubScope("one"), betaPower)
	return op.Div(s, x, graphutil.CastTo(s.SubScope("den"), op.Sub(s.SubScope("sub"), one, betaPower), x.DataType()))
}
