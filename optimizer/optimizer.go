// Package optimizer holds the optimizers of tfdist — SGD, Momentum, Adam,
// AdamW, LARS and LAMB — and learning-rate schedules computed in the graph
// from the optimizer's step count (decays, a linear Warmup in front of any
// of them, and the linear scaling rule for large batches), or a rate kept
// in a variable that the program sets between steps (NewAdjustable), as
// Keras's callbacks set optimizer.learning_rate.
//
// Each optimizer keeps its slots (momentum accumulators, Adam's moments) and
// its step count ("<name>/iterations") as variables of the strategy, mirrored
// like the variables they serve and saved in checkpoints with them.
//
// LossScale wraps any of them in dynamic loss scaling for float16 mixed
// precision, as Keras' LossScaleOptimizer.
package optimizer

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// base is what every optimizer shares: a name, a schedule, and the step
// count variable it increments after each update.
type base struct {
	name string
	lr   Schedule
}

// update is what an optimizer's Apply builds its update from: the step
// count variable, its value before the update, the learning rate for that
// step, and a scope named after the optimizer.
type update struct {
	it   strategy.Variable
	step tf.Output
	lr   tf.Output
	s    *op.Scope
}

// begin checks grads against vars and the schedule (and hyper, the
// optimizer's own check of its hyperparameters), then reads the step count
// and builds the learning rate.
func (b *base) begin(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable, hyper error) (update, error) {
	if err := errors.Join(hyper, validateSchedule(b.lr)); err != nil {
		return update{}, fmt.Errorf("%s: %w", b.name, err)
	}
	if err := checkGrads(grads, vars); err != nil {
		return update{}, err
	}
	it, step, err := b.iterations(ac)
	if err != nil {
		return update{}, err
	}
	s := ac.Scope().SubScope(b.name)
	lr, err := buildRate(ac, b.name, b.lr, s.SubScope("lr"), step)
	if err != nil {
		return update{}, err
	}
	return update{it: it, step: step, lr: lr, s: s}, nil
}

// varUpdate builds the update of vars[i], v, on its own scope s.
type varUpdate func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error)

// apply is an optimizer's Apply: begin, then perVar(u)'s update of every
// variable, then the increment of the step count after them all.
func (b *base) apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable, hyper error, perVar func(u update) varUpdate) (*tf.Operation, error) {
	u, err := b.begin(ac, grads, vars, hyper)
	if err != nil {
		return nil, err
	}
	build := perVar(u)
	var ups []*tf.Operation
	for i, v := range vars {
		ops, err := build(i, v, u.s.SubScope(fmt.Sprintf("var_%d", i)))
		if err != nil {
			return nil, err
		}
		ups = append(ups, ops...)
	}
	if err := u.s.Err(); err != nil {
		return nil, err
	}
	return b.finish(ac, u.it, ups)
}

// iterations returns the step count variable and its value before the
// update.
func (b *base) iterations(ac strategy.ApplyContext) (strategy.Variable, tf.Output, error) {
	it, err := ac.NonSlot(b.name, "iterations", tf.Int64, nil, strategy.Zeros())
	if err != nil {
		return nil, tf.Output{}, err
	}
	s := ac.Scope().SubScope(b.name + "_iterations")
	return it, op.ReadVariableOp(s, ac.Handle(it), tf.Int64), nil
}

// finish returns one op that runs updates and then increments the step
// count it.
func (b *base) finish(ac strategy.ApplyContext, it strategy.Variable, updates []*tf.Operation) (*tf.Operation, error) {
	s := ac.Scope().SubScope(b.name + "_finish").WithControlDependencies(updates...)
	inc := op.AssignAddVariableOp(s.SubScope("increment"), ac.Handle(it), op.Const(s.SubScope("one"), int64(1)))
	done := op.NoOp(s.SubScope("done").WithControlDependencies(inc))
	return done, s.Err()
}

// slots returns the slot variables named names that b keeps for v.
func (b *base) slots(ac strategy.ApplyContext, v strategy.Variable, names ...string) ([]strategy.Variable, error) {
	out := make([]strategy.Variable, len(names))
	for i, name := range names {
		var err error
		if out[i], err = ac.Slot(b.name, v, name, strategy.Zeros()); err != nil {
			return nil, err
		}
	}
	return out, nil
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
	return o.apply(ac, grads, vars, nil, func(u update) varUpdate {
		return func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error) {
			return []*tf.Operation{op.ResourceApplyGradientDescent(s, ac.Handle(v), graphutil.CastTo(s, u.lr, v.DType()), grads[i])}, nil
		}
	})
}

// Momentum is SGD with momentum. NewMomentum's is TensorFlow's
// (ResourceApplyMomentum): a = m*a + g; v -= lr*a, or the Nesterov variant
// v -= lr*(g + m*a). NewKerasMomentum's is Keras' SGD with momentum
// (ResourceApplyKerasMomentum): a = m*a - lr*g; v += a, or v += m*a - lr*g.
// The two agree while the learning rate is constant. When it changes (a
// warmup, a decay) TensorFlow's applies the new rate to the whole
// accumulated velocity at once — Goyal et al. (2017)'s momentum correction —
// while Keras' velocity keeps the steps taken at the old rates.
type Momentum struct {
	base
	momentum float32
	nesterov bool
	keras    bool
}

// NewMomentum returns TensorFlow's SGD with momentum m, the Nesterov
// variant if nesterov is set, with the given schedule (Constant(0.01) if
// nil).
func NewMomentum(lr Schedule, m float32, nesterov bool) *Momentum {
	return &Momentum{base: base{name: "Momentum", lr: scheduleOr(lr, 0.01)}, momentum: m, nesterov: nesterov}
}

// NewKerasMomentum returns Keras' SGD with momentum m (keras.optimizers.SGD
// with momentum and nesterov), with the given schedule (Constant(0.01) if
// nil). Its name, and so its slots' and step count's, is "KerasMomentum":
// a checkpoint of one variant does not restore into the other, whose
// accumulator means something else.
func NewKerasMomentum(lr Schedule, m float32, nesterov bool) *Momentum {
	return &Momentum{base: base{name: "KerasMomentum", lr: scheduleOr(lr, 0.01)}, momentum: m, nesterov: nesterov, keras: true}
}

// Named returns o under name, which names its slots and its step count
// ("<name>/iterations") in place of "Momentum" or "KerasMomentum": two
// optimizers of one strategy need two names, or they share a step count.
func (o *Momentum) Named(name string) *Momentum {
	c := *o
	c.name = name
	return &c
}

// Apply implements strategy.Optimizer.
func (o *Momentum) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	return o.apply(ac, grads, vars, between("momentum", o.momentum, 0, 1), func(u update) varUpdate {
		return func(i int, v strategy.Variable, s *op.Scope) ([]*tf.Operation, error) {
			acc, err := o.slots(ac, v, "momentum")
			if err != nil {
				return nil, err
			}
			lr, m := graphutil.CastTo(s, u.lr, v.DType()), constOf(s.SubScope("momentum"), o.momentum, v.DType())
			if o.keras {
				return []*tf.Operation{op.ResourceApplyKerasMomentum(s, ac.Handle(v), ac.Handle(acc[0]), lr, grads[i], m,
					op.ResourceApplyKerasMomentumUseNesterov(o.nesterov))}, nil
			}
			return []*tf.Operation{op.ResourceApplyMomentum(s, ac.Handle(v), ac.Handle(acc[0]), lr, grads[i], m,
				op.ResourceApplyMomentumUseNesterov(o.nesterov))}, nil
		}
	})
}
