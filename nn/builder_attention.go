package nn

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// Einsum returns the Einstein summation of xs that equation describes
// (tf.einsum: "BTD,DNH->BTNH" projects [batch, time, d] to heads).
func (b *Builder) Einsum(equation string, xs ...tf.Output) tf.Output {
	return op.Einsum(b.s.SubScope("einsum"), xs, equation)
}

// Transpose returns x with its axes permuted: axis i of the result is
// axis perm[i] of x.
func (b *Builder) Transpose(x tf.Output, perm ...int32) tf.Output {
	return op.Transpose(b.s.SubScope("transpose"), x, b.Const(perm))
}

// BatchMatMul returns the products x·y of the matrices in x's and y's
// last two axes, broadcasting the axes before them.
func (b *Builder) BatchMatMul(x, y tf.Output) tf.Output {
	return op.BatchMatMulV2(b.s.SubScope("batch_matmul"), x, y)
}

// Where returns x where cond is true and y elsewhere; cond and y
// broadcast to x's shape.
func (b *Builder) Where(cond, x, y tf.Output) tf.Output {
	return op.Select(b.s.SubScope("select"), b.BroadcastTo(cond, x), x, b.BroadcastTo(y, x))
}

// dim returns the size of x's axis as an int32 scalar, known when the
// graph runs.
func (b *Builder) dim(x tf.Output, axis int32) tf.Output {
	return op.GatherV2(b.s.SubScope("dim"), op.Shape(b.s.SubScope("shape"), x), b.Const(axis), b.Const(int32(0)))
}
