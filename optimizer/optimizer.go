// Package optimizer holds the optimizers of tfdist — SGD, Momentum and Adam —
// built on TensorFlow's ResourceApply* kernels, with learning-rate schedules
// computed in the graph from the optimizer's step count.
//
// Each optimizer keeps its slots (momentum accumulators, Adam's moments) and
// its step count ("<name>/iterations") as variables of the strategy, mirrored
// like the variables they serve and saved in checkpoints with them.
package optimizer

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// base is what every optimizer shares: a name, a schedule, and the step
// count variable it increments after each update.
type base struct {
	name string
	lr   Schedule
}

// iterations returns the replica's step count read and the op that
// increments it after deps.
func (b *base) iterations(ac strategy.ApplyContext) (strategy.Variable, tf.Output, error) {
	it, err := ac.NonSlot(b.name, "iterations", tf.Int64, nil, strategy.Zeros())
	if err != nil {
		return nil, tf.Output{}, err
	}
	s := ac.Scope().SubScope(b.name + "_iterations")
	return it, op.ReadVariableOp(s, ac.Handle(it), tf.Int64), nil
}

func (b *base) finish(ac strategy.ApplyContext, it strategy.Variable, updates []*tf.Operation) (*tf.Operation, error) {
	s := ac.Scope().SubScope(b.name + "_finish").WithControlDependencies(updates...)
	inc := op.AssignAddVariableOp(s.SubScope("increment"), ac.Handle(it), op.Const(s.SubScope("one"), int64(1)))
	done := op.NoOp(s.SubScope("done").WithControlDependencies(inc))
	return done, s.Err()
}

func checkGrads(grads []tf.Output, vars []strategy.Variable) error {
	if len(grads) != len(vars) {
		return fmt.Errorf("%d gradients for %d variables", len(grads), len(vars))
	}
	for i, v := range vars {
		if grads[i].DataType() != v.DType() {
			return fmt.Errorf("gradient %d is %v, variable %q is %v", i, grads[i].DataType(), v.Name(), v.DType())
		}
	}
	return nil
}

func scheduleOr(lr Schedule, def float32) Schedule {
	if lr == nil {
		return Constant(def)
	}
	return lr
}

// SGD is stochastic gradient descent: v -= lr * g
// (ResourceApplyGradientDescent).
type SGD struct {
	base
}

// NewSGD returns plain SGD with the given schedule (Constant(0.01) if nil).
func NewSGD(lr Schedule) *SGD { return &SGD{base{name: "SGD", lr: scheduleOr(lr, 0.01)}} }

// Apply implements strategy.Optimizer.
func (o *SGD) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if err := checkGrads(grads, vars); err != nil {
		return nil, err
	}
	it, step, err := o.iterations(ac)
	if err != nil {
		return nil, err
	}
	s := ac.Scope().SubScope("SGD")
	lr := o.lr.Build(s.SubScope("lr"), step)
	var ups []*tf.Operation
	for i, v := range vars {
		vs := s.SubScope(fmt.Sprintf("var_%d", i))
		ups = append(ups, op.ResourceApplyGradientDescent(vs, ac.Handle(v), castTo(vs, lr, v.DType()), grads[i]))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return o.finish(ac, it, ups)
}

// Momentum is SGD with momentum: a = m*a + g; v -= lr*a, or the Nesterov
// variant (ResourceApplyMomentum).
type Momentum struct {
	base
	momentum float32
	nesterov bool
}

// NewMomentum returns SGD with momentum m.
func NewMomentum(lr Schedule, m float32, nesterov bool) *Momentum {
	return &Momentum{base: base{name: "Momentum", lr: scheduleOr(lr, 0.01)}, momentum: m, nesterov: nesterov}
}

// Apply implements strategy.Optimizer.
func (o *Momentum) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if err := checkGrads(grads, vars); err != nil {
		return nil, err
	}
	it, step, err := o.iterations(ac)
	if err != nil {
		return nil, err
	}
	s := ac.Scope().SubScope("Momentum")
	lr := o.lr.Build(s.SubScope("lr"), step)
	var ups []*tf.Operation
	for i, v := range vars {
		acc, err := ac.Slot(o.name, v, "momentum", strategy.Zeros())
		if err != nil {
			return nil, err
		}
		vs := s.SubScope(fmt.Sprintf("var_%d", i))
		ups = append(ups, op.ResourceApplyMomentum(vs, ac.Handle(v), ac.Handle(acc), castTo(vs, lr, v.DType()), grads[i],
			castTo(vs.SubScope("m"), op.Const(vs.SubScope("momentum"), o.momentum), v.DType()),
			op.ResourceApplyMomentumUseNesterov(o.nesterov)))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return o.finish(ac, it, ups)
}

// Adam is Kingma and Ba's Adam (ResourceApplyAdam), with bias correction
// from the step count.
type Adam struct {
	base
	beta1, beta2, epsilon float32
}

// NewAdam returns Adam with Keras' defaults (beta1 0.9, beta2 0.999,
// epsilon 1e-7) and the given schedule (Constant(0.001) if nil).
func NewAdam(lr Schedule) *Adam {
	return &Adam{base: base{name: "Adam", lr: scheduleOr(lr, 0.001)}, beta1: 0.9, beta2: 0.999, epsilon: 1e-7}
}

// WithBetas sets beta1 and beta2.
func (o *Adam) WithBetas(b1, b2 float32) *Adam { o.beta1, o.beta2 = b1, b2; return o }

// WithEpsilon sets epsilon.
func (o *Adam) WithEpsilon(eps float32) *Adam { o.epsilon = eps; return o }

// Apply implements strategy.Optimizer.
func (o *Adam) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if err := checkGrads(grads, vars); err != nil {
		return nil, err
	}
	it, step, err := o.iterations(ac)
	if err != nil {
		return nil, err
	}
	s := ac.Scope().SubScope("Adam")
	lr := o.lr.Build(s.SubScope("lr"), step)
	t := op.Cast(s.SubScope("t"), op.Add(s.SubScope("t1"), step, op.Const(s.SubScope("one"), int64(1))), tf.Float)
	b1p := op.Pow(s.SubScope("beta1_power"), op.Const(s.SubScope("beta1"), o.beta1), t)
	b2p := op.Pow(s.SubScope("beta2_power"), op.Const(s.SubScope("beta2"), o.beta2), t)
	var ups []*tf.Operation
	for i, v := range vars {
		m, err := ac.Slot(o.name, v, "m", strategy.Zeros())
		if err != nil {
			return nil, err
		}
		vv, err := ac.Slot(o.name, v, "v", strategy.Zeros())
		if err != nil {
			return nil, err
		}
		vs := s.SubScope(fmt.Sprintf("var_%d", i))
		dt := v.DType()
		ups = append(ups, op.ResourceApplyAdam(vs, ac.Handle(v), ac.Handle(m), ac.Handle(vv),
			castTo(vs.SubScope("b1p"), b1p, dt), castTo(vs.SubScope("b2p"), b2p, dt), castTo(vs.SubScope("lr"), lr, dt),
			castTo(vs.SubScope("b1"), op.Const(vs.SubScope("beta1"), o.beta1), dt),
			castTo(vs.SubScope("b2"), op.Const(vs.SubScope("beta2"), o.beta2), dt),
			castTo(vs.SubScope("eps"), op.Const(vs.SubScope("epsilon"), o.epsilon), dt), grads[i]))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return o.finish(ac, it, ups)
}

func castTo(s *op.Scope, x tf.Output, dt tf.DataType) tf.Output {
	if x.DataType() == dt {
		return x
	}
	return op.Cast(s.SubScope("cast"), x, dt)
}
