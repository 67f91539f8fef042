// Package models holds the digits models of tfdist's examples and tests:
// one source for every strategy. Each is an nn.Sequential on the shipped
// digits (64 features, 10 classes).
package models

import (
	"context"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

// Names lists the models New knows.
var Names = []string{"mlp", "lenet", "lenet-bn"}

// New builds the model called name in sc: "mlp", a ReLU hidden layer of
// hidden units, or "lenet", a LeNet-style CNN on the 8x8x1 images (two
// 3x3 convolutions of 6 and 16 filters, each followed by 2x2 max pooling,
// then dense layers of hidden units and 10 logits), or "lenet-bn", the
// same with batch normalisation after each convolution. seed seeds the
// initial weights. The model computes in float32; its WithPolicy gives
// it a mixed-precision policy.
func New(sc strategy.Scope, name string, hidden int, seed int64) (*nn.Sequential, error) {
	switch name {
	case "mlp":
		m, err := nn.NewMLP(sc, "mlp", []int{digits.Features, hidden, digits.Classes}, seed)
		if err != nil {
			return nil, err
		}
		return m.Sequential, nil
	case "lenet", "lenet-bn":
		return nn.NewSequential(sc, name, []int64{digits.Features}, seed, lenet(name == "lenet-bn", hidden)...)
	}
	return nil, fmt.Errorf("model %q: expected one of %v", name, Names)
}

// lenet returns the layers of the LeNet-style CNN, with batch
// normalisation after each convolution when bn is set.
func lenet(bn bool, hidden int) []nn.Spec {
	conv := func(filters int) []nn.Spec {
		if !bn {
			return []nn.Spec{nn.Conv2D{Filters: filters, Kernel: 3, Padding: nn.Same, Activation: nn.ReLU}}
		}
		return []nn.Spec{nn.Conv2D{Filters: filters, Kernel: 3, Padding: nn.Same}, nn.BatchNorm{}, nn.ActivationLayer{Activation: nn.ReLU}}
	}
	layers := append([]nn.Spec{nn.Reshape{Shape: []int64{8, 8, 1}}}, conv(6)...)
	layers = append(append(append(layers, nn.MaxPool2D{Size: 2}), conv(16)...), nn.MaxPool2D{Size: 2}, nn.Flatten{})
	return append(layers, nn.Dense{Units: hidden, Activation: nn.ReLU}, nn.Dense{Units: digits.Classes})
}

// Spec is the input of the digits models' steps: x [batch, 64] float32
// features and y [batch] int32 labels.
var Spec = strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}}, "y": {DType: tf.Int32, Shape: []int64{-1}}}

// OptimizerFor returns opt as it must be to train a model under policy p:
// wrapped in dynamic loss scaling (optimizer.NewLossScale, Keras'
// defaults) under mixed_float16, unchanged otherwise.
func OptimizerFor(p nn.Policy, opt strategy.Optimizer) (strategy.Optimizer, error) {
	if p.CheckOptimizer(opt) == nil {
		return opt, nil
	}
	return optimizer.NewLossScale(opt)
}

// TrainStep returns the step that trains m with opt: the softmax
// cross-entropy of its logits, averaged as the strategy averages losses,
// minimised with opts (strategy.WithAccumulation, say); a DP-SGD optimizer
// (strategy.PrivateOptimizer) minimises the per-example losses instead.
// The step outputs that average loss as "loss". An optimizer that cannot train under m's
// policy (one without loss scaling under mixed_float16: see OptimizerFor)
// fails the step's Build.
func TrainStep(m *nn.Sequential, opt strategy.Optimizer, opts ...strategy.MinimizeOption) strategy.ReplicaFn {
	return PoisonedTrainStep(m, opt, nil, opts...)
}

// PoisonedTrainStep is TrainStep whose replicas that poisoned reports
// (nil: none) minimise their loss times NaN, as a faulty device would:
// their gradients are NaN, the loss they output is the honest one.
func PoisonedTrainStep(m *nn.Sequential, opt strategy.Optimizer, poisoned func(replica int) bool, opts ...strategy.MinimizeOption) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		if err := m.Policy().CheckOptimizer(opt); err != nil {
			return nil, err
		}
		logits, err := m.Apply(r, in["x"], true)
		if err != nil {
			return nil, err
		}
		perExample := nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("loss"), logits, in["y"], digits.Classes)
		loss := r.AverageLoss(perExample)
		minimized := loss
		if _, ok := opt.(strategy.PrivateOptimizer); ok { // DP-SGD differentiates each example's loss
			minimized = perExample
		}
		if poisoned != nil && poisoned(r.ReplicaID()) {
			s := r.Scope().SubScope("poison")
			nan := op.Cast(s, op.Const(s.SubScope("nan"), float32(math.NaN())), minimized.DataType())
			minimized = op.Mul(s, minimized, nan)
		}
		return strategy.Outputs{"loss": loss}, r.Minimize(opt, minimized, m.Vars(), opts...)
	}
}

// EvalStep returns the step that outputs, as "correct", how many examples
// of the batch m classifies right (inference behaviour); when acc is not
// nil, the step also adds the batch to acc.
func EvalStep(m *nn.Sequential, acc *metrics.Accuracy) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := m.Apply(r, in["x"], false)
		if err != nil {
			return nil, err
		}
		if acc != nil {
			if err := acc.Update(r, logits, in["y"]); err != nil {
				return nil, err
			}
		}
		s := r.Scope().SubScope("accuracy")
		return strategy.Outputs{"correct": graphutil.SumAll(s.SubScope("sum"), nn.Correct(s, logits, in["y"]))}, nil
	}
}

// ServingSignature is the digits models' serving_default signature: it
// takes x (float32, [batch, 64]) and returns the logits of m in inference
// behaviour (float32, [batch, 10]).
func ServingSignature(m *nn.Sequential) savedmodel.Signature {
	return savedmodel.Signature{
		Name:   savedmodel.DefaultSignature,
		Inputs: strategy.InputSpec{"x": Spec["x"]},
		Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"], false)
			return strategy.Outputs{"logits": logits}, err
		},
	}
}

// Accuracy returns the share of test that eval, an EvalStep of acc built
// by s, classifies right: metrics.Evaluate over batches of batch examples
// (the last one smaller), each worker scoring its shard (DATA sharding),
// acc summing the counts over all replicas and workers, so that every
// example counts once and every worker gets the same accuracy.
func Accuracy(ctx context.Context, s strategy.Strategy, eval strategy.Step, acc *metrics.Accuracy, test digits.Data, batch int) (float64, error) {
	if acc == nil {
		return 0, fmt.Errorf("models: Accuracy: nil metric, expected the one eval updates")
	}
	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	if err != nil {
		return 0, err
	}
	dist, err := s.DistributeDataset(dataset.Batched(ds, batch, false), dataset.WithShardPolicy(dataset.ShardBatch))
	if err != nil {
		return 0, err
	}
	res, err := metrics.Evaluate(ctx, s, eval, dist, acc)
	if err != nil {
		return 0, err
	}
	return res[acc.Name()], nil
}
