package train

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/nn"
)

// Metric is a metric Compile takes, kept as Keras keeps a stateful metric
// over an epoch: each step adds, for every replica's batch, the sums the
// metric needs (its right answers and its examples, say), Fit adds them up
// across replicas, workers and steps in float64, and Result turns the
// totals into the metric's value. Computed from each step's outputs, a
// metric is exact across workers and counts a step once, even under
// parameter servers where a step may run twice.
type Metric interface {
	// Name is the metric's key in Logs and History ("val_" + Name for
	// validation).
	Name() string
	// Sums builds, on s, the float32 scalars the metric adds up for one
	// replica's batch: yPred against yTrue, each example weighted by
	// weight (a [batch] tensor of ones when the batch has no sample
	// weights).
	Sums(s *op.Scope, yTrue, yPred, weight tf.Output) ([]tf.Output, error)
	// Result returns the metric from the totals of its sums.
	Result(totals []float64) float64
}

// SparseCategoricalAccuracy is the share of examples whose largest
// prediction is at their integer label: Keras's
// SparseCategoricalAccuracy, named "accuracy" (NamedMetric renames it).
type SparseCategoricalAccuracy struct{}

// Name implements Metric.
func (SparseCategoricalAccuracy) Name() string { return "accuracy" }

// Sums implements Metric: the weighted right answers and the weights.
func (m SparseCategoricalAccuracy) Sums(s *op.Scope, yTrue, yPred, weight tf.Output) ([]tf.Output, error) {
	if dt := yTrue.DataType(); dt != tf.Int32 && dt != tf.Int64 {
		return nil, fmt.Errorf("labels of type %s, expected integer class ids", graphutil.DTypeName(yTrue.DataType()))
	}
	if err := sameLeading(yTrue, yPred, 1); err != nil {
		return nil, err
	}
	b := nn.NewBuilder(s, "accuracy")
	axis := b.Const(int32(yPred.Shape().NumDimensions() - 1))
	pred := op.ArgMax(b.Op(), yPred, axis, op.ArgMaxOutputType(yTrue.DataType()))
	return weightedMean(b, op.Equal(b.Op(), pred, yTrue), weight), b.Err()
}

// CategoricalAccuracy is the share of examples whose largest prediction is
// where their one-hot label's largest value is: Keras's
// CategoricalAccuracy, named "accuracy".
type CategoricalAccuracy struct{}

// Name implements Metric.
func (CategoricalAccuracy) Name() string { return "accuracy" }

// Sums implements Metric.
func (m CategoricalAccuracy) Sums(s *op.Scope, yTrue, yPred, weight tf.Output) ([]tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return nil, err
	}
	b := nn.NewBuilder(s, "accuracy")
	axis := b.Const(int32(yPred.Shape().NumDimensions() - 1))
	eq := op.Equal(b.Op(), op.ArgMax(b.Op(), yPred, axis), op.ArgMax(b.Op(), yTrue, axis))
	return weightedMean(b, eq, weight), b.Err()
}

// BinaryAccuracy is the share of predictions on the right side of
// Threshold (0.5 when 0): Keras's BinaryAccuracy, named "accuracy".
type BinaryAccuracy struct{ Threshold float32 }

// Name implements Metric.
func (BinaryAccuracy) Name() string { return "accuracy" }

// Sums implements Metric.
func (m BinaryAccuracy) Sums(s *op.Scope, yTrue, yPred, weight tf.Output) ([]tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return nil, err
	}
	th := m.Threshold
	if th == 0 {
		th = 0.5
	}
	b := nn.NewBuilder(s, "binary_accuracy")
	pred := op.Greater(b.Op(), yPred, b.Cast(b.Const(th), yPred.DataType()))
	truth := op.Greater(b.Op(), b.Cast(yTrue, yPred.DataType()), b.Cast(b.Const(float32(0.5)), yPred.DataType()))
	return weightedMean(b, op.Equal(b.Op(), pred, truth), weight), b.Err()
}

// MeanMetric is the weighted mean over examples of a per-element value of
// the predictions against the labels, averaged over each example's
// elements: Keras's MeanSquaredError and MeanAbsoluteError metrics are
// MSE and MAE.
// It is named after Fn.
type MeanMetric struct {
	// Fn is the per-element value: a Loss.
	Fn Loss
}

// MSE is Keras's MeanSquaredError metric, named "mse".
func MSE() Metric { return NamedMetric("mse", MeanMetric{Fn: MeanSquaredError{}}) }

// MAE is Keras's MeanAbsoluteError metric, named "mae".
func MAE() Metric { return NamedMetric("mae", MeanMetric{Fn: MeanAbsoluteError{}}) }

// Name implements Metric.
func (m MeanMetric) Name() string {
	if m.Fn == nil {
		return "mean"
	}
	return m.Fn.Name()
}

// NamedMetric returns m under another name: its key in Logs and History.
func NamedMetric(name string, m Metric) Metric { return named{Metric: m, name: name} }

type named struct {
	Metric
	name string
}

func (n named) Name() string { return n.name }

// Sums implements Metric.
func (m MeanMetric) Sums(s *op.Scope, yTrue, yPred, weight tf.Output) ([]tf.Output, error) {
	if m.Fn == nil {
		return nil, errors.New("no function (MeanMetric.Fn)")
	}
	v, err := m.Fn.Call(s.SubScope("fn"), yTrue, yPred)
	if err != nil {
		return nil, err
	}
	b := nn.NewBuilder(s, "mean_metric")
	return weightedMean(b, perExample(b, v), weight), b.Err()
}

// Result implements Metric: total / count (0 before any example).
func (SparseCategoricalAccuracy) Result(t []float64) float64 { return ratio(t) }

// Result implements Metric.
func (CategoricalAccuracy) Result(t []float64) float64 { return ratio(t) }

// Result implements Metric.
func (BinaryAccuracy) Result(t []float64) float64 { return ratio(t) }

// Result implements Metric.
func (MeanMetric) Result(t []float64) float64 { return ratio(t) }

func ratio(t []float64) float64 {
	if len(t) != 2 || t[1] == 0 {
		return 0
	}
	return t[0] / t[1]
}

// weightedMean returns the sums of a weighted mean of x (any shape
// [batch, …], bool or numeric): Σ weight·mean(x over its non-batch axes)
// and Σ weight, as float32 scalars.
func weightedMean(b *nn.Builder, x, weight tf.Output) []tf.Output {
	v := perExample(b, b.Cast(x, tf.Float))
	w := b.Cast(weight, tf.Float)
	return []tf.Output{b.SumAll(b.Mul(v, w)), b.SumAll(w)}
}

// perExample returns the mean of x over every axis but the first.
func perExample(b *nn.Builder, x tf.Output) tf.Output {
	rank := x.Shape().NumDimensions()
	if rank <= 1 {
		return x
	}
	axes := make([]int32, rank-1)
	for i := range axes {
		axes[i] = int32(i + 1)
	}
	return b.Mean(x, false, axes...)
}
