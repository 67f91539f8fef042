package nn

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// Builder adds ops to a graph under one namespace and names each op
// itself (matmul, matmul_1, …), so that model code never makes a
// sub-scope per op. Errors stay in the scope and come back from Err, and
// from the strategy's Build. Ops it does not wrap take Op() as their scope.
type Builder struct {
	s *op.Scope
}

// NewBuilder returns a Builder over a fresh sub-scope of s named name.
func NewBuilder(s *op.Scope, name string) *Builder { return &Builder{s: s.SubScope(name)} }

// Op returns a fresh, uniquely named scope for one op of any kind.
func (b *Builder) Op() *op.Scope { return b.s.SubScope("op") }

// In returns a Builder for a part of the model, in a namespace of its own.
func (b *Builder) In(name string) *Builder { return NewBuilder(b.s, name) }

// Err returns the first error of any op built so far.
func (b *Builder) Err() error { return b.s.Err() }

// Const returns a constant holding v (any value tf.NewTensor takes).
func (b *Builder) Const(v any) tf.Output { return op.Const(b.s.SubScope("const"), v) }

// Scalar returns the scalar v of type dtype.
func (b *Builder) Scalar(v float64, dtype tf.DataType) tf.Output {
	c := b.Const(float32(v))
	if dtype != tf.Float {
		c = op.Cast(b.s.SubScope("cast"), c, dtype)
	}
	return c
}

// MatMul returns x·y.
func (b *Builder) MatMul(x, y tf.Output) tf.Output { return op.MatMul(b.s.SubScope("matmul"), x, y) }

// Add returns x+y, broadcasting.
func (b *Builder) Add(x, y tf.Output) tf.Output { return op.AddV2(b.s.SubScope("add"), x, y) }

// Sub returns x-y, broadcasting.
func (b *Builder) Sub(x, y tf.Output) tf.Output { return op.Sub(b.s.SubScope("sub"), x, y) }

// Mul returns x*y, broadcasting.
func (b *Builder) Mul(x, y tf.Output) tf.Output { return op.Mul(b.s.SubScope("mul"), x, y) }

// Div returns x/y, broadcasting.
func (b *Builder) Div(x, y tf.Output) tf.Output { return op.RealDiv(b.s.SubScope("div"), x, y) }

// Square returns x².
func (b *Builder) Square(x tf.Output) tf.Output { return op.Square(b.s.SubScope("square"), x) }

// Rsqrt returns 1/√x.
func (b *Builder) Rsqrt(x tf.Output) tf.Output { return op.Rsqrt(b.s.SubScope("rsqrt"), x) }

// Relu returns max(x, 0).
func (b *Builder) Relu(x tf.Output) tf.Output { return op.Relu(b.s.SubScope("relu"), x) }

// Tanh returns tanh(x).
func (b *Builder) Tanh(x tf.Output) tf.Output { return op.Tanh(b.s.SubScope("tanh"), x) }

// Sigmoid returns 1/(1+e^-x).
func (b *Builder) Sigmoid(x tf.Output) tf.Output { return op.Sigmoid(b.s.SubScope("sigmoid"), x) }

// Reshape returns x with the given shape (one dimension may be -1).
func (b *Builder) Reshape(x tf.Output, shape ...int64) tf.Output {
	return op.Reshape(b.s.SubScope("reshape"), x, b.Const(shape))
}

// Sum returns the sum of x over axes, keeping them as size 1 when keep.
func (b *Builder) Sum(x tf.Output, keep bool, axes ...int32) tf.Output {
	return op.Sum(b.s.SubScope("sum"), x, b.Const(axes), op.SumKeepDims(keep))
}

// Mean returns the mean of x over axes, keeping them as size 1 when keep.
func (b *Builder) Mean(x tf.Output, keep bool, axes ...int32) tf.Output {
	return op.Mean(b.s.SubScope("mean"), x, b.Const(axes), op.MeanKeepDims(keep))
}

// SumAll returns the sum of every element of x.
func (b *Builder) SumAll(x tf.Output) tf.Output { return graphutil.SumAll(b.s.SubScope("sum_all"), x) }

// Cast returns x converted to dtype.
func (b *Builder) Cast(x tf.Output, dtype tf.DataType) tf.Output {
	if x.DataType() == dtype {
		return x
	}
	return op.Cast(b.s.SubScope("cast"), x, dtype)
}

// Count returns the number of elements along x's first axis, as a scalar
// of dtype.
func (b *Builder) Count(x tf.Output, dtype tf.DataType) tf.Output {
	n := op.Slice(b.s.SubScope("count"), op.Shape(b.s.SubScope("shape"), x), b.Const([]int32{0}), b.Const([]int32{1}))
	return b.Cast(op.Reshape(b.s.SubScope("scalar"), n, b.Const([]int32{})), dtype)
}
