package nn

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Add sums two or more inputs of one shape, element by element (Keras'
// layers.Add): a residual connection is Add{}.Call(x, f(x)).
type Add struct{}

// Kind implements AnySpec.
func (Add) Kind() string { return "add" }

// BuildMulti implements MultiSpec.
func (Add) BuildMulti(_ strategy.Scope, _ string, in [][]int64, _ int64) (MultiLayer, []int64, error) {
	return buildElementwise("Add", in, func(b *Builder, x, y tf.Output) tf.Output { return b.Add(x, y) })
}

// Call returns the output of a new Add layer called on xs.
func (a Add) Call(xs ...*Tensor) *Tensor { return callSpec(a, xs) }

// Multiply multiplies two or more inputs of one shape, element by element
// (Keras' layers.Multiply).
type Multiply struct{}

// Kind implements AnySpec.
func (Multiply) Kind() string { return "multiply" }

// BuildMulti implements MultiSpec.
func (Multiply) BuildMulti(_ strategy.Scope, _ string, in [][]int64, _ int64) (MultiLayer, []int64, error) {
	return buildElementwise("Multiply", in, func(b *Builder, x, y tf.Output) tf.Output { return b.Mul(x, y) })
}

// Call returns the output of a new Multiply layer called on xs.
func (m Multiply) Call(xs ...*Tensor) *Tensor { return callSpec(m, xs) }

// elementwise folds its inputs with fn.
type elementwise struct {
	fn func(b *Builder, x, y tf.Output) tf.Output
}

func buildElementwise(layer string, in [][]int64, fn func(b *Builder, x, y tf.Output) tf.Output) (MultiLayer, []int64, error) {
	if len(in) < 2 {
		return nil, nil, fmt.Errorf("%s: called on %d inputs, expected at least 2", layer, len(in))
	}
	out := in[0]
	for _, s := range in[1:] {
		if !fitShape(s, out) {
			return nil, nil, fmt.Errorf("%s: inputs of shapes %v, expected one shape (without the batch)", layer, in)
		}
	}
	return elementwise{fn: fn}, out, nil
}

func (elementwise) Vars() []strategy.Variable { return nil }

func (e elementwise) ApplyMulti(r strategy.Replica, xs []tf.Output, _ bool) (tf.Output, error) {
	b := NewBuilder(r.Scope(), "merge")
	y := xs[0]
	for _, x := range xs[1:] {
		y = e.fn(b, y, x)
	}
	return y, b.Err()
}

// Concatenate joins two or more inputs along Axis, numbered as Keras
// numbers it: -1 (and the zero value) the last axis, 1 the first after
// the batch. The inputs' other dimensions must agree.
type Concatenate struct {
	Axis int
}

// Kind implements AnySpec.
func (Concatenate) Kind() string { return "concatenate" }

// Call returns the output of a new Concatenate layer called on xs.
func (c Concatenate) Call(xs ...*Tensor) *Tensor { return callSpec(c, xs) }

// BuildMulti implements MultiSpec.
func (c Concatenate) BuildMulti(_ strategy.Scope, _ string, in [][]int64, _ int64) (MultiLayer, []int64, error) {
	if len(in) < 2 {
		return nil, nil, fmt.Errorf("Concatenate: called on %d inputs, expected at least 2", len(in))
	}
	rank := len(in[0])
	axis := c.Axis // among the axes after the batch
	switch {
	case axis == 0:
		axis = rank - 1
	case axis < 0:
		axis += rank
	default:
		axis--
	}
	if axis < 0 || axis >= rank {
		return nil, nil, fmt.Errorf("Concatenate: Axis %d, expected -%d to -1 or 1 to %d for inputs of shape %v", c.Axis, rank, rank, withBatch(in[0]))
	}
	out := slices.Clone(in[0])
	for _, s := range in[1:] {
		if !fitOffAxis(s, out, axis) {
			return nil, nil, fmt.Errorf("Concatenate: inputs of shapes %v differ off axis %d (without the batch)", in, c.Axis)
		}
		if out[axis] >= 0 && s[axis] >= 0 {
			out[axis] += s[axis]
		} else {
			out[axis] = -1
		}
	}
	return concatenate{axis: int32(axis + 1)}, out, nil
}

// fitOffAxis reports whether shapes a and b fit on every axis but axis.
func fitOffAxis(a, b []int64, axis int) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	a[axis], b[axis] = -1, -1
	return fitShape(a, b)
}

type concatenate struct{ axis int32 }

func (concatenate) Vars() []strategy.Variable { return nil }

func (c concatenate) ApplyMulti(r strategy.Replica, xs []tf.Output, _ bool) (tf.Output, error) {
	b := NewBuilder(r.Scope(), "concatenate")
	return op.ConcatV2(b.Op(), xs, b.Const(c.axis)), b.Err()
}
