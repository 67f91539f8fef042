package allreducebench

import (
	"context"
	"errors"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// sizeSteps are the steps that all-reduce one size's variable.
type sizeSteps struct {
	// timed all-reduces the variable and returns, as "first", the first
	// element of the sum (not under compression, whose all-reduce is a
	// gradient's, whose sum the optimizer takes): the step's time is the
	// all-reduce's, not a copy of its result.
	timed strategy.Step
	// sum returns every replica's whole sum.
	sum func(context.Context, *multiworker.Strategy, []map[string]*tf.Tensor) (strategy.PerReplica, error)
}

// dummySpec is the input of every size's steps: none that matters.
var dummySpec = strategy.InputSpec{"dummy": {DType: tf.Float, Shape: []int64{}}}

// buildSteps builds v's steps: a replica's AllReduce, or with asGradient
// the all-reduce of v's values as v's gradient, compressed as the
// strategy compresses gradients.
func buildSteps(s *multiworker.Strategy, v strategy.Variable, asGradient bool) (sizeSteps, error) {
	if asGradient {
		return gradientSteps(s, v)
	}
	sum := func(rc strategy.Replica) (tf.Output, error) {
		x, err := rc.Read(v)
		if err != nil {
			return tf.Output{}, err
		}
		return rc.AllReduce(strategy.Sum, x)
	}
	timed, err := s.Build(dummySpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
		y, err := sum(rc)
		if err != nil {
			return nil, err
		}
		sc := rc.Scope().SubScope("first")
		first := op.Slice(sc, y, op.Const(sc.SubScope("begin"), []int64{0}), op.Const(sc.SubScope("size"), []int64{1}))
		return strategy.Outputs{"first": first}, nil
	})
	if err != nil {
		return sizeSteps{}, err
	}
	check, err := s.Build(dummySpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
		y, err := sum(rc)
		return strategy.Outputs{"sum": y}, err
	})
	return sizeSteps{timed: timed, sum: func(ctx context.Context, s *multiworker.Strategy, feeds []map[string]*tf.Tensor) (strategy.PerReplica, error) {
		res, err := s.RunReplicas(ctx, check, feeds, 1)
		return res["sum"], err
	}}, err
}

// gradientSteps all-reduce v's values as v's gradient: the timed step
// applies nothing (sink); the sum's step writes the sum into v (assign),
// which a last step reads.
func gradientSteps(s *multiworker.Strategy, v strategy.Variable) (sizeSteps, error) {
	apply := func(opt strategy.Optimizer) (strategy.Step, error) {
		return s.Build(dummySpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
			x, err := rc.Read(v)
			if err != nil {
				return nil, err
			}
			return strategy.Outputs{}, rc.ApplyGradients(opt, []tf.Output{x}, []strategy.Variable{v})
		})
	}
	timed, err1 := apply(sink{})
	write, err2 := apply(assign{})
	read, err3 := s.Build(dummySpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
		x, err := rc.Read(v)
		return strategy.Outputs{"sum": x}, err
	})
	if err := errors.Join(err1, err2, err3); err != nil {
		return sizeSteps{}, err
	}
	return sizeSteps{timed: timed, sum: func(ctx context.Context, s *multiworker.Strategy, feeds []map[string]*tf.Tensor) (strategy.PerReplica, error) {
		if _, err := s.RunReplicas(ctx, write, feeds, 1); err != nil {
			return nil, err
		}
		res, err := s.RunReplicas(ctx, read, feeds, 1)
		return res["sum"], err
	}}, nil
}

// assign is an optimizer that sets each variable to its reduced gradient.
type assign struct{}

func (assign) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	ops := make([]*tf.Operation, len(grads))
	for i, g := range grads {
		ops[i] = op.AssignVariableOp(ac.Scope().SubScope("assign"), ac.Handle(vars[i]), g)
	}
	return op.NoOp(ac.Scope().SubScope("assigned").WithControlDependencies(ops...)), nil
}
