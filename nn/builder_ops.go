package nn

import (
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// Gelu returns x/2·(1+erf(x/√2)), the exact GELU (tf.nn.gelu).
func (b *Builder) Gelu(x tf.Output) tf.Output {
	dt := x.DataType()
	erf := op.Erf(b.s.SubScope("erf"), b.Div(x, b.Scalar(math.Sqrt2, dt)))
	return b.Mul(b.Mul(b.Scalar(0.5, dt), x), b.Add(b.Scalar(1, dt), erf))
}

// GeluTanh returns x/2·(1+tanh(√(2/π)·(x+0.044715x³))), GELU's tanh
// approximation (tf.nn.gelu with approximate=True).
func (b *Builder) GeluTanh(x tf.Output) tf.Output {
	dt := x.DataType()
	cube := op.Pow(b.s.SubScope("pow"), x, b.Scalar(3, dt))
	inner := b.Mul(b.Scalar(math.Sqrt(2/math.Pi), dt), b.Add(x, b.Mul(b.Scalar(0.044715, dt), cube)))
	return b.Mul(b.Mul(b.Scalar(0.5, dt), x), b.Add(b.Scalar(1, dt), b.Tanh(inner)))
}

// Silu returns x·sigmoid(x) (tf.nn.silu, Keras' swish).
func (b *Builder) Silu(x tf.Output) tf.Output { return b.Mul(x, b.Sigmoid(x)) }

// Softmax returns e^x/Σe^x over x's last axis.
func (b *Builder) Softmax(x tf.Output) tf.Output { return op.Softmax(b.s.SubScope("softmax"), x) }

// BiasAdd returns y plus bias over y's last axis (tf.nn.bias_add), whose
// gradient is one BiasAddGrad.
func (b *Builder) BiasAdd(y, bias tf.Output) tf.Output {
	return op.BiasAdd(b.s.SubScope("bias_add"), y, bias)
}

// MatMulLast returns x·w over x's last axis, as Keras' Dense and
// tf.tensordot(x, w, 1) compute it: x [batch, …, n] and w [n, m] (of a
// known shape) give [batch, …, m]. A matrix x is one MatMul; x of another
// rank is reshaped to [-1, n] and the product back to x's leading
// dimensions.
func (b *Builder) MatMulLast(x, w tf.Output) tf.Output {
	if x.Shape().NumDimensions() == 2 {
		return b.MatMul(x, w)
	}
	n, m := w.Shape().Size(0), w.Shape().Size(1)
	y := b.MatMul(b.Reshape(x, -1, n), w)
	lead := op.StridedSlice(b.s.SubScope("leading_dims"), op.Shape(b.s.SubScope("shape"), x),
		b.Const([]int32{0}), b.Const([]int32{-1}), b.Const([]int32{1}))
	shape := op.ConcatV2(b.s.SubScope("out_shape"), []tf.Output{lead, b.Const([]int32{int32(m)})}, b.Const(int32(0)))
	return op.Reshape(b.s.SubScope("reshape"), y, shape)
}

// BroadcastTo returns x broadcast to the shape of like.
func (b *Builder) BroadcastTo(x, like tf.Output) tf.Output {
	return op.BroadcastTo(b.s.SubScope("broadcast_to"), x, op.Shape(b.s.SubScope("shape"), like))
}

// firstRows returns the first n rows of the matrix x or, for n < 0, as
// many as like's dimension axis (counted from 0, the batch) at run time,
// failing the step with message and that dimension when x has fewer.
func (b *Builder) firstRows(x tf.Output, n int64, like tf.Output, axis int, message string) tf.Output {
	rows := b.Const([]int32{int32(n)})
	if n < 0 {
		rows = op.Slice(b.s.SubScope("rows"), op.Shape(b.s.SubScope("shape"), like), b.Const([]int32{int32(axis)}), b.Const([]int32{1}))
		ok := op.All(b.s.SubScope("fits"), op.LessEqual(b.s.SubScope("less_equal"), rows, b.Const([]int32{int32(x.Shape().Size(0))})), b.Const(int32(0)))
		check := op.Assert(b.s.SubScope("check_rows"), ok, []tf.Output{b.Const(message), rows})
		rows = op.Identity(b.s.SubScope("checked").WithControlDependencies(check), rows)
	}
	size := op.ConcatV2(b.s.SubScope("size"), []tf.Output{rows, b.Const([]int32{-1})}, b.Const(int32(0)))
	return op.Slice(b.s.SubScope("slice"), x, b.Const([]int32{0, 0}), size)
}
