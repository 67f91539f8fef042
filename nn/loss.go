package nn

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// SparseSoftmaxCrossEntropy returns the per-example cross-entropy of logits
// [batch, classes] against integer labels [batch]. It one-hot encodes the
// labels and uses SoftmaxCrossEntropy, whose gradient TensorFlow's C++
// registry has (the sparse kernel's gradient is Python-only).
func SparseSoftmaxCrossEntropy(s *op.Scope, logits, labels tf.Output, classes int) tf.Output {
	if labels.DataType() != tf.Int32 && labels.DataType() != tf.Int64 {
		labels = op.Cast(s.SubScope("labels"), labels, tf.Int32)
	}
	onehot := op.OneHot(s.SubScope("onehot"), labels, op.Const(s.SubScope("depth"), int32(classes)),
		op.Const(s.SubScope("on"), float32(1)), op.Const(s.SubScope("off"), float32(0)))
	if logits.DataType() != tf.Float {
		onehot = op.Cast(s.SubScope("cast"), onehot, logits.DataType())
	}
	return SoftmaxCrossEntropy(s.SubScope("xent"), logits, onehot)
}

// SoftmaxCrossEntropy returns the cross-entropy of each row of logits
// [n, classes] against the probabilities labels of the same shape. It uses
// TensorFlow's fused kernel, except where TensorFlow's op determinism is on
// (a strategy's WithDeterministic) and the op may run on another device
// than a CPU: there the fused kernel has no deterministic implementation
// and fails, so it computes −Σ labels · log_softmax(logits), as Python
// does under op determinism.
func SoftmaxCrossEntropy(s *op.Scope, logits, labels tf.Output) tf.Output {
	logits = op.Identity(s.SubScope("logits"), logits)
	if !tfrt.OpDeterminism() || tfrt.IsCPU(logits.Op.Device()) {
		loss, _ := op.SoftmaxCrossEntropyWithLogits(s.SubScope("fused"), logits, labels)
		return loss
	}
	b := NewBuilder(s, "log_softmax")
	return op.Neg(b.Op(), op.Sum(b.Op(), b.Mul(labels, op.LogSoftmax(b.Op(), logits)), b.Const(int32(-1))))
}

// SigmoidCrossEntropy returns the per-element logistic loss of logits
// against labels in [0, 1] of the same shape: max(z, 0) - z·y +
// log(1 + e^-|z|), which stays finite for any z.
func SigmoidCrossEntropy(s *op.Scope, logits, labels tf.Output) tf.Output {
	b := NewBuilder(s, "sigmoid_xent")
	labels = b.Cast(labels, logits.DataType())
	softplus := op.Log1p(b.Op(), op.Exp(b.Op(), op.Neg(b.Op(), op.Abs(b.Op(), logits))))
	return b.Add(b.Sub(b.Relu(logits), b.Mul(logits, labels)), softplus)
}

// MeanSquaredError returns, per example, the mean over the other axes of
// (predictions - targets)²; for predictions of rank 1 it is the squared
// error itself.
func MeanSquaredError(s *op.Scope, predictions, targets tf.Output) tf.Output {
	b := NewBuilder(s, "mse")
	sq := op.SquaredDifference(b.Op(), predictions, b.Cast(targets, predictions.DataType()))
	n, err := predictions.Shape().ToSlice()
	if err != nil || len(n) < 2 {
		return sq
	}
	axes := make([]int32, len(n)-1)
	for i := range axes {
		axes[i] = int32(i + 1)
	}
	return b.Mean(sq, false, axes...)
}

// Correct returns, per example, 1 where argmax(logits) equals the label and 0
// elsewhere, as float32.
func Correct(s *op.Scope, logits, labels tf.Output) tf.Output {
	pred := op.ArgMax(s.SubScope("argmax"), logits, op.Const(s.SubScope("axis"), int32(1)), op.ArgMaxOutputType(labels.DataType()))
	return op.Cast(s.SubScope("correct"), op.Equal(s.SubScope("eq"), pred, labels), tf.Float)
}
