package allreducebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// The labels of an overlap measurement's timings.
const (
	LabelCompute   = "compute"   // the step on one device, no communication
	LabelAllReduce = "allreduce" // the step's gradient all-reduce alone
	LabelStep      = "step"      // the distributed step
)

// engine is what an overlap measurement needs of a strategy.
type engine interface {
	Scope(func(strategy.Scope) error) error
	Build(strategy.InputSpec, strategy.ReplicaFn) (strategy.Step, error)
	RunReplicas(context.Context, strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
}

// overlap times, in this worker, the training step of an MLP of c.Model's
// layer sizes on c.Batch examples three ways: its compute alone (the
// default strategy, no communication), the all-reduce of its gradients'
// bytes alone (the same packs, no compute), and the distributed step on s.
// The peers measure the same at the same time.
func overlap(ctx context.Context, s *multiworker.Strategy, c Config) ([]Timing, error) {
	def, err := onedevice.New()
	if err != nil {
		return nil, err
	}
	defer def.Close()
	var opt strategy.Optimizer = optimizer.NewSGD(optimizer.Constant(0.01))
	if c.Adam {
		opt = optimizer.NewAdam(optimizer.Constant(0.001))
	}
	compute, bytes, err := timeMLP(ctx, def, c, opt, false)
	if err != nil {
		return nil, fmt.Errorf("compute alone: %w", err)
	}
	comm, _, err := timeMLP(ctx, s, c, sink{}, true)
	if err != nil {
		return nil, fmt.Errorf("all-reduce alone: %w", err)
	}
	step, _, err := timeMLP(ctx, s, c, opt, false)
	if err != nil {
		return nil, fmt.Errorf("step: %w", err)
	}
	return []Timing{{Label: LabelCompute, Bytes: bytes, Seconds: compute}, {Label: LabelAllReduce, Bytes: bytes, Seconds: comm},
		{Label: LabelStep, Bytes: bytes, Seconds: step}}, nil
}

// timeMLP builds the MLP on e and times c.iters steps after c.Warmup, each
// applying opt to the gradients, or with commOnly to the variables' own
// values standing in for them (the all-reduce without the compute). It
// returns the seconds per step and the gradients' bytes.
func timeMLP(ctx context.Context, e engine, c Config, opt strategy.Optimizer, commOnly bool) (float64, int64, error) {
	var m *nn.MLP
	if err := e.Scope(func(sc strategy.Scope) error {
		var err error
		m, err = nn.NewMLP(sc, fmt.Sprintf("mlp_%v", commOnly), c.Model, 1)
		return err
	}); err != nil {
		return 0, 0, err
	}
	in, out := c.Model[0], c.Model[len(c.Model)-1]
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, int64(in)}}, "y": {DType: tf.Int32, Shape: []int64{-1}}}
	step, err := e.Build(spec, func(rc strategy.Replica, x strategy.Inputs) (strategy.Outputs, error) {
		if commOnly {
			grads := make([]tf.Output, len(m.Vars()))
			for i, v := range m.Vars() {
				var err error
				if grads[i], err = rc.Read(v); err != nil {
					return nil, err
				}
			}
			return strategy.Outputs{}, rc.ApplyGradients(opt, grads, m.Vars())
		}
		logits, err := m.Apply(rc, x["x"])
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(rc.Scope().SubScope("loss"), logits, x["y"], out))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, m.Vars())
	})
	if err != nil {
		return 0, 0, err
	}
	feeds, err := mlpBatch(c.Batch, in, out)
	if err != nil {
		return 0, 0, err
	}
	for range c.Warmup {
		if _, err := e.RunReplicas(ctx, step, feeds, c.Batch); err != nil {
			return 0, 0, err
		}
	}
	var bytes int64
	for _, v := range m.Vars() {
		n := int64(4)
		for _, d := range v.Shape() {
			n *= d
		}
		bytes += n
	}
	start, n := time.Now(), c.iters(bytes)
	for range n {
		if _, err := e.RunReplicas(ctx, step, feeds, c.Batch); err != nil {
			return 0, 0, err
		}
	}
	return time.Since(start).Seconds() / float64(n), bytes, nil
}

// mlpBatch is one replica's batch of random examples.
func mlpBatch(batch, in, classes int) ([]map[string]*tf.Tensor, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([][]float32, batch)
	ys := make([]int32, batch)
	for i := range xs {
		xs[i] = make([]float32, in)
		for j := range xs[i] {
			xs[i][j] = rng.Float32()
		}
		ys[i] = int32(rng.IntN(classes))
	}
	x, err := tf.NewTensor(xs)
	if err != nil {
		return nil, err
	}
	y, err := tf.NewTensor(ys)
	if err != nil {
		return nil, err
	}
	return []map[string]*tf.Tensor{{"x": x, "y": y}}, nil
}

// sink is an optimizer that applies nothing: a step with it runs the
// gradients' all-reduce and no update.
type sink struct{}

func (sink) Apply(ac strategy.ApplyContext, grads []tf.Output, _ []strategy.Variable) (*tf.Operation, error) {
	deps := make([]*tf.Operation, len(grads))
	for i, g := range grads {
		deps[i] = g.Op
	}
	return op.NoOp(ac.Scope().SubScope("sink").WithControlDependencies(deps...)), nil
}
