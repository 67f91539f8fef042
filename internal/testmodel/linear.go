package testmodel

import (
	"context"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Linear is a linear regression for tests that drive the runs themselves:
// three weights w, and the loss (x·w - y)² averaged with AverageLoss,
// minimised by SGD, on examples computed from their index.
type Linear struct {
	W    strategy.Variable
	Step strategy.Step
	e    Engine
}

// LinearSpec is Linear's input spec.
var LinearSpec = strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 3}}, "y": {DType: tf.Float, Shape: []int64{-1}}}

// NewLinear creates w, named "w", in e and builds the step that minimises
// the loss with SGD(lr) and opts. The step outputs each replica's share of
// the loss as "loss" and declares their sum as the reduced output
// "mean_loss".
func NewLinear(e Engine, lr float32, opts ...strategy.MinimizeOption) (*Linear, error) {
	return NewLinearWith(e, optimizer.NewSGD(optimizer.Constant(lr)), opts...)
}

// NewLinearWith is NewLinear minimised by opt.
func NewLinearWith(e Engine, opt strategy.Optimizer, opts ...strategy.MinimizeOption) (*Linear, error) {
	l := &Linear{e: e}
	w0, err := tf.NewTensor([]float32{0.5, -0.25, 0.1})
	if err != nil {
		return nil, err
	}
	if err := e.Scope(func(sc strategy.Scope) error {
		l.W, err = sc.Variable("w", tf.Float, []int64{3}, strategy.Constant(w0))
		return err
	}); err != nil {
		return nil, err
	}
	l.Step, err = e.Build(LinearSpec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := r.Scope().SubScope("linear")
		pred := op.Squeeze(s.SubScope("pred"), op.MatMul(s.SubScope("matmul"), in["x"],
			op.Reshape(s.SubScope("w"), strategy.MustRead(r, l.W), op.Const(s.SubScope("shape"), []int32{3, 1}))))
		loss := r.AverageLoss(op.Square(s.SubScope("square"), op.Sub(s.SubScope("err"), pred, in["y"])))
		if err := r.ReduceOutput("mean_loss", strategy.Sum, loss); err != nil {
			return nil, err
		}
		return strategy.Outputs{"loss": loss}, r.Minimize(opt, loss, []strategy.Variable{l.W}, opts...)
	})
	return l, err
}

// Run runs the step on the n examples from lo, split evenly among the
// local replicas of an engine that runs every replica.
func (l *Linear) Run(ctx context.Context, lo, n int) (strategy.Result, error) {
	return RunLinear(ctx, l.e, l.Step, lo, n)
}

// RunLinear runs step, of LinearSpec's inputs, as Linear.Run runs its own.
func RunLinear(ctx context.Context, e Engine, step strategy.Step, lo, n int) (strategy.Result, error) {
	reps := e.NumLocalReplicas()
	if n%reps != 0 {
		return nil, fmt.Errorf("%d examples for %d replicas", n, reps)
	}
	feeds := make([]map[string]*tf.Tensor, reps)
	for r := range feeds {
		var x [][]float32
		var y []float32
		for i := lo + r*n/reps; i < lo+(r+1)*n/reps; i++ {
			f := float64(i)
			x = append(x, []float32{float32(math.Sin(f)), float32(math.Cos(f)), 1})
			y = append(y, float32(i%7)/7)
		}
		xt, err := tf.NewTensor(x)
		if err != nil {
			return nil, err
		}
		yt, err := tf.NewTensor(y)
		if err != nil {
			return nil, err
		}
		feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
	}
	return e.RunReplicas(ctx, step, feeds, n)
}

// Weights returns w.
func (l *Linear) Weights(ctx context.Context) ([]float32, error) {
	t, err := l.e.Value(ctx, l.W)
	if err != nil {
		return nil, err
	}
	return tensorutil.Value(t).([]float32), nil
}
