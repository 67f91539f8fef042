package optimizer

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Adam is Kingma and Ba's Adam (ResourceApplyAdam), with bias correction
// from the step count: Keras' Adam without amsgrad.
type Adam struct {
	base
	beta1, beta2, epsilon float32
}

// NewAdam returns Adam with Keras' defaults (beta1 0.9, beta2 0.999,
// epsilon 1e-7) and the given schedule (Constant(0.001) if nil).
func NewAdam(lr Schedule) *Adam {
	return &Adam{base: base{name: "Adam", lr: scheduleOr(lr, 0.001)}, beta1: 0.9, beta2: 0.999, epsilon: 1e-7}
}

// WithBetas sets beta1 and beta2, each in [0, 1); Apply refuses others.
func (o *Adam) WithBetas(b1, b2 float32) *Adam { o.beta1, o.beta2 = b1, b2; return o }

// WithEpsilon sets epsilon, finite and not negative; Apply refuses others.
func (o *Adam) WithEpsilon(eps float32) *Adam { o.epsilon = eps; return o }

// Apply implements strategy.Optimizer.
func (o *Adam) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	h := hyper{beta1: o.beta1, beta2: o.beta2, epsilon: o.epsilon}
	return adamUpdate(ac, &o.base, h, nil, grads, vars)
}

// AdamW is Adam with decoupled weight decay (Loshchilov and Hutter, 2019)
// as Keras 3's AdamW computes it: each step, every variable not excluded
// first decays to v - v·wd·lr, lr being the step's learning rate, and then
// takes Adam's update from its gradient. The decay does not go through the
// moments.
type AdamW struct {
	base
	h       hyper
	exclude exclusions
}

// NewAdamW returns AdamW with Keras' defaults: the schedule Constant(0.001)
// if lr is nil, weight decay 0.004, betas 0.9 and 0.999, epsilon 1e-7, and
// no variable excluded from the decay. Options: WithWeightDecay,
// WithBetas, WithEpsilon and ExcludeFromWeightDecay (Keras'
// exclude_from_weight_decay(var_names=…), whose names are patterns too).
func NewAdamW(lr Schedule, opts ...Option) (*AdamW, error) {
	def := hyper{weightDecay: 0.004, beta1: 0.9, beta2: 0.999, epsilon: 1e-7}
	h, err := newHyper("AdamW", def, []string{"WithWeightDecay", "WithBetas", "WithEpsilon", "ExcludeFromWeightDecay"}, opts)
	if err != nil {
		return nil, err
	}
	o := &AdamW{base: base{name: "AdamW", lr: scheduleOr(lr, 0.001)}, h: h}
	if o.exclude, err = compileExclusions("AdamW: ExcludeFromWeightDecay", h.decayExclude); err != nil {
		return nil, err
	}
	if err := validateSchedule(o.lr); err != nil {
		return nil, fmt.Errorf("AdamW: %w", err)
	}
	return o, nil
}

// Apply implements strategy.Optimizer.
func (o *AdamW) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	decayed := func(v strategy.Variable) bool { return o.h.weightDecay != 0 && !o.exclude.match(v) }
	return adamUpdate(ac, &o.base, o.h, decayed, grads, vars)
}

// adamUpdate builds Adam's update of vars with h's betas and epsilon and
// b's schedule and step count, slots named after b. The variables decayed
// reports (none if it is nil) first decay by h's weight decay (AdamW).
func adamUpdate(ac strategy.ApplyContext, b *base, h hyper, decayed func(strategy.Variable) bool, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	hyperErr := errors.Join(fraction("beta1", h.beta1), fraction("beta2", h.beta2), nonNegative("epsilon", h.epsilon))
	return b.apply(ac, grads, vars, hyperErr, func(u update) varUpdate {
		b1p, b2p := betaPowers(u, h)
		return func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error) {
			mv, err := b.slots(ac, v, "m", "v")
			if err != nil {
				return nil, err
			}
			dt := v.DType()
			lr := graphutil.CastTo(s.SubScope("lr"), u.lr, dt)
			if decayed != nil && decayed(v) {
				s = s.WithControlDependencies(decay(ac, s.SubScope("decay"), v, grads[i], lr, h.weightDecay))
			}
			return []*tf.Operation{op.ResourceApplyAdam(s, ac.Handle(v), ac.Handle(mv[0]), ac.Handle(mv[1]),
				graphutil.CastTo(s.SubScope("b1p"), b1p, dt), graphutil.CastTo(s.SubScope("b2p"), b2p, dt), lr,
				constOf(s.SubScope("beta1"), h.beta1, dt), constOf(s.SubScope("beta2"), h.beta2, dt),
				constOf(s.SubScope("epsilon"), h.epsilon, dt), grads[i])}, nil
		}
	})
}

// betaPowers returns beta1 and beta2 to the power of the step number
// (counting from 1), for the bias correction of Adam's moments.
func betaPowers(u update, h hyper) (b1p, b2p tf.Output) {
	s := u.s
	t := op.Cast(s.SubScope("t"), op.Add(s.SubScope("t1"), u.step, op.Const(s.SubScope("one"), int64(1))), tf.Float)
	b1p = op.Pow(s.SubScope("beta1_power"), op.Const(s.SubScope("beta1"), h.beta1), t)
	b2p = op.Pow(s.SubScope("beta2_power"), op.Const(s.SubScope("beta2"), h.beta2), t)
	return b1p, b2p
}

// decay builds v -= v·wd·lr, Keras' decoupled weight decay, to run once g
// is computed: under the parameter-server strategy the gradients of a step
// that must not update (a rerun) are dead tensors, and the decay, gated on
// them, is skipped with the rest of the update.
func decay(ac strategy.ApplyContext, s *op.Scope, v strategy.Variable, g, lr tf.Output, wd float32) *tf.Operation {
	gate := op.Identity(s.SubScope("gate"), g)
	s = s.WithControlDependencies(gate.Op)
	w := op.ReadVariableOp(s.SubScope("read"), ac.Handle(v), v.DType())
	dec := op.Mul(s.SubScope("times_lr"), op.Mul(s.SubScope("times_wd"), w, constOf(s.SubScope("wd"), wd, v.DType())), lr)
	return op.AssignSubVariableOp(s.SubScope("assign_sub"), ac.Handle(v), dec)
}

// constOf is the constant x as a tensor of type dt.
func constOf(s *op.Scope, x float32, dt tf.DataType) tf.Output {
	return graphutil.CastTo(s, op.Const(s.SubScope("value"), x), dt)
}
