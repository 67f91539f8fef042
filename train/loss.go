package train

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/nn"
)

// Loss is a loss function Compile takes: for one replica's batch it
// returns the loss of every element, of shape [batch, …]. Fit averages it
// the way Keras's losses reduce (sum over batch size): each example's
// loss is the mean of its elements (of every token of a sequence, say),
// weighted by the batch's "sample_weight" when it has one, and the step's
// loss is the mean over every example of the global step.
type Loss interface {
	// Name names the loss in errors.
	Name() string
	// Call builds the loss of every element of yPred against yTrue on s.
	Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error)
}

// SparseCategoricalCrossentropy is the cross-entropy of predictions
// [batch, …, classes] against integer labels [batch, …]: Keras's
// SparseCategoricalCrossentropy. FromLogits says the predictions are
// logits; otherwise they are probabilities.
type SparseCategoricalCrossentropy struct{ FromLogits bool }

// Name implements Loss.
func (SparseCategoricalCrossentropy) Name() string { return "sparse_categorical_crossentropy" }

// Call implements Loss.
func (l SparseCategoricalCrossentropy) Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error) {
	if dt := yTrue.DataType(); dt != tf.Int32 && dt != tf.Int64 {
		return tf.Output{}, fmt.Errorf("%s: labels of type %s, expected integer class ids", l.Name(), graphutil.DTypeName(yTrue.DataType()))
	}
	classes, err := lastDim(yPred, l.Name())
	if err != nil {
		return tf.Output{}, err
	}
	if err := sameLeading(yTrue, yPred, 1); err != nil {
		return tf.Output{}, fmt.Errorf("%s: %w", l.Name(), err)
	}
	b := nn.NewBuilder(s, "sparse_xent")
	logits := toLogits(b, yPred, l.FromLogits)
	flat := b.Reshape(logits, -1, classes)
	onehot := op.OneHot(b.Op(), b.Reshape(b.Cast(yTrue, tf.Int32), -1), op.Const(b.Op(), int32(classes)),
		op.Const(b.Op(), float32(1)), op.Const(b.Op(), float32(0)))
	loss := nn.SoftmaxCrossEntropy(b.Op(), flat, b.Cast(onehot, flat.DataType()))
	return op.Reshape(b.Op(), loss, op.Shape(b.Op(), yTrue)), b.Err()
}

// CategoricalCrossentropy is the cross-entropy of predictions
// [batch, …, classes] against one-hot (or soft) labels of the same shape:
// Keras's CategoricalCrossentropy.
type CategoricalCrossentropy struct{ FromLogits bool }

// Name implements Loss.
func (CategoricalCrossentropy) Name() string { return "categorical_crossentropy" }

// Call implements Loss.
func (l CategoricalCrossentropy) Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return tf.Output{}, fmt.Errorf("%s: %w", l.Name(), err)
	}
	classes, err := lastDim(yPred, l.Name())
	if err != nil {
		return tf.Output{}, err
	}
	b := nn.NewBuilder(s, "xent")
	logits := b.Reshape(toLogits(b, yPred, l.FromLogits), -1, classes)
	loss := nn.SoftmaxCrossEntropy(b.Op(), logits, b.Reshape(b.Cast(yTrue, logits.DataType()), -1, classes))
	return op.Reshape(b.Op(), loss, leadingShape(b, yPred)), b.Err()
}

// BinaryCrossentropy is the logistic loss of predictions against labels
// in [0, 1] of the same shape: Keras's BinaryCrossentropy.
type BinaryCrossentropy struct{ FromLogits bool }

// Name implements Loss.
func (BinaryCrossentropy) Name() string { return "binary_crossentropy" }

// Call implements Loss.
func (l BinaryCrossentropy) Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return tf.Output{}, fmt.Errorf("%s: %w", l.Name(), err)
	}
	b := nn.NewBuilder(s, "binary_xent")
	logits := yPred
	if !l.FromLogits {
		p := clipProb(b, yPred)
		logits = b.Sub(op.Log(b.Op(), p), op.Log1p(b.Op(), op.Neg(b.Op(), p)))
	}
	return nn.SigmoidCrossEntropy(b.Op(), logits, yTrue), b.Err()
}

// MeanSquaredError is the squared difference of predictions and targets of
// the same shape: Keras's MeanSquaredError.
type MeanSquaredError struct{}

// Name implements Loss.
func (MeanSquaredError) Name() string { return "mean_squared_error" }

// Call implements Loss.
func (l MeanSquaredError) Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return tf.Output{}, fmt.Errorf("%s: %w", l.Name(), err)
	}
	b := nn.NewBuilder(s, "mse")
	return op.SquaredDifference(b.Op(), yPred, b.Cast(yTrue, yPred.DataType())), b.Err()
}

// MeanAbsoluteError is the absolute difference of predictions and targets
// of the same shape: Keras's MeanAbsoluteError.
type MeanAbsoluteError struct{}

// Name implements Loss.
func (MeanAbsoluteError) Name() string { return "mean_absolute_error" }

// Call implements Loss.
func (l MeanAbsoluteError) Call(s *op.Scope, yTrue, yPred tf.Output) (tf.Output, error) {
	if err := sameShape(yTrue, yPred); err != nil {
		return tf.Output{}, fmt.Errorf("%s: %w", l.Name(), err)
	}
	b := nn.NewBuilder(s, "mae")
	return op.Abs(b.Op(), b.Sub(yPred, b.Cast(yTrue, yPred.DataType()))), b.Err()
}

// epsilon is Keras's backend epsilon, the clip of probabilities.
const epsilon = 1e-7

func clipProb(b *nn.Builder, p tf.Output) tf.Output {
	lo, hi := b.Cast(b.Const(float32(epsilon)), p.DataType()), b.Cast(b.Const(float32(1-epsilon)), p.DataType())
	return op.ClipByValue(b.Op(), p, lo, hi)
}

// toLogits turns probabilities into logits (their log, clipped as Keras
// clips them) unless the predictions are logits already.
func toLogits(b *nn.Builder, y tf.Output, fromLogits bool) tf.Output {
	if fromLogits {
		return y
	}
	return op.Log(b.Op(), clipProb(b, y))
}

// lastDim returns the static size of y's last axis.
func lastDim(y tf.Output, loss string) (int64, error) {
	dims, err := y.Shape().ToSlice()
	if err != nil || len(dims) < 2 || dims[len(dims)-1] < 1 {
		return 0, fmt.Errorf("%s: predictions of shape %v, expected [batch, …, classes] with a known number of classes", loss, y.Shape())
	}
	return dims[len(dims)-1], nil
}

// sameShape checks that labels and predictions have the same static shape
// (unknown dimensions agree with any).
func sameShape(yTrue, yPred tf.Output) error {
	return sameLeading(yTrue, yPred, 0)
}

// sameLeading checks that labels have the shape of the predictions
// without their last drop axes.
func sameLeading(yTrue, yPred tf.Output, drop int) error {
	t, errT := yTrue.Shape().ToSlice()
	p, errP := yPred.Shape().ToSlice()
	if errT != nil || errP != nil {
		return nil
	}
	want := p[:max(len(p)-drop, 0)]
	ok := len(t) == len(want)
	for i := 0; ok && i < len(t); i++ {
		ok = t[i] < 0 || want[i] < 0 || t[i] == want[i]
	}
	if !ok {
		return fmt.Errorf("labels of shape %s and predictions of shape %s, expected labels of shape %s", shapeString(t), shapeString(p), shapeString(want))
	}
	return nil
}

func shapeString(s []int64) string {
	out := "["
	for i, d := range s {
		if i > 0 {
			out += " "
		}
		if d < 0 {
			out += "?"
		} else {
			out += fmt.Sprint(d)
		}
	}
	return out + "]"
}

// leadingShape returns y's dynamic shape without its last axis.
func leadingShape(b *nn.Builder, y tf.Output) tf.Output {
	rank := y.Shape().NumDimensions()
	return op.Slice(b.Op(), op.Shape(b.Op(), y), b.Const([]int32{0}), b.Const([]int32{int32(rank - 1)}))
}
