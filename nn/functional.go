package nn

import (
	"fmt"
	"slices"
	"sync/atomic"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// This file is the functional model API, Keras' keras.Input and
// keras.Model(inputs, outputs): layers are called on symbolic Tensors,
// which record the calls, and NewModel builds every layer between the
// model's inputs and outputs, in the order they were called.

// Tensor is a symbolic tensor of a model's definition: an Input, or the
// output of a layer called on Tensors. It holds no value; NewModel builds
// the layers that lead to it, and Model.Apply computes it for a replica.
type Tensor struct {
	id    int64 // the order tensors were made in: a topological order
	call  *call // the layer call that outputs it; nil for an Input
	dtype tf.DataType
	shape []int64 // an Input's shape without the batch dimension
	name  string  // an Input's name; "" until NewModel names it
}

// call is one call of a layer on tensors.
type call struct {
	layer  *Shared
	inputs []*Tensor
}

var tensorIDs atomic.Int64

// Input returns a model input of float32 examples of the given shape,
// without the batch dimension (keras.Input(shape=…)); -1 is a dimension
// of any size.
func Input(shape ...int64) *Tensor { return InputOf(tf.Float, shape...) }

// InputOf returns a model input of dtype examples of the given shape
// (InputOf(tf.Int32, 64): a sequence of 64 token ids).
func InputOf(dtype tf.DataType, shape ...int64) *Tensor {
	return &Tensor{id: tensorIDs.Add(1), dtype: dtype, shape: slices.Clone(shape)}
}

// Named returns a copy of the input t named name, as Summary shows it.
func (t *Tensor) Named(name string) *Tensor {
	c := *t
	c.name = name
	return &c
}

// AnySpec is a layer's description that a model can build: a Spec (one
// input) or a MultiSpec (several: Add, Concatenate, MultiHeadAttention, a
// Model).
type AnySpec interface {
	// Kind names the layer's type ("dense", "add", …).
	Kind() string
}

// MultiSpec describes a layer of several inputs before its variables
// exist.
type MultiSpec interface {
	AnySpec
	// BuildMulti creates the layer's variables in sc, named "<name>/…",
	// for inputs of the shapes in (without the batch dimension), and
	// returns the layer and the shape of its output.
	BuildMulti(sc strategy.Scope, name string, in [][]int64, seed int64) (MultiLayer, []int64, error)
}

// MultiLayer is a built layer of several inputs.
type MultiLayer interface {
	// Vars returns the layer's trainable variables.
	Vars() []strategy.Variable
	// ApplyMulti builds the layer for one replica on xs, whose first
	// dimension is the batch.
	ApplyMulti(r strategy.Replica, xs []tf.Output, training bool) (tf.Output, error)
}

// Shared is one layer that may be called several times, in one model or
// in several: every call uses the same variables (a Keras layer object
// called twice). A layer spec's own Call method makes a new layer each
// time.
type Shared struct {
	spec AnySpec
	name string
}

// Share returns a layer of spec, a Spec or a MultiSpec, that every Call
// shares.
func Share(spec AnySpec) *Shared { return &Shared{spec: spec} }

// Named returns a layer of spec named name in its model, so that its
// variables are "<model>/<name>/…"; unnamed layers are
// "<model>/<kind>_<k>". Two layers of one model may not share a name.
func Named(name string, spec AnySpec) *Shared { return &Shared{spec: spec, name: name} }

// Call returns the output of the layer called on xs.
func (l *Shared) Call(xs ...*Tensor) *Tensor {
	return &Tensor{id: tensorIDs.Add(1), call: &call{layer: l, inputs: xs}}
}

// callSpec returns the output of a new layer of spec called on xs.
func callSpec(spec AnySpec, xs []*Tensor) *Tensor { return Share(spec).Call(xs...) }

// multi returns spec as a MultiSpec: a Spec takes exactly one input.
func multi(spec AnySpec) (MultiSpec, error) {
	switch s := spec.(type) {
	case MultiSpec:
		return s, nil
	case Spec:
		return single{s}, nil
	case nil:
		return nil, fmt.Errorf("nil layer spec")
	}
	return nil, fmt.Errorf("%T is neither an nn.Spec nor an nn.MultiSpec", spec)
}

// single adapts a Spec of one input to a MultiSpec.
type single struct{ Spec }

func (s single) BuildMulti(sc strategy.Scope, name string, in [][]int64, seed int64) (MultiLayer, []int64, error) {
	if len(in) != 1 {
		return nil, nil, fmt.Errorf("called on %d inputs %v, expected one", len(in), in)
	}
	l, out, err := s.Build(sc, name, in[0], seed)
	if err != nil {
		return nil, nil, err
	}
	return singleLayer{l}, out, nil
}

type singleLayer struct{ Layer }

func (l singleLayer) ApplyMulti(r strategy.Replica, xs []tf.Output, training bool) (tf.Output, error) {
	return l.Apply(r, xs[0], training)
}

// The layers' Call methods: each makes a new layer and calls it on x
// (Dense{Units: 64}.Call(x), Keras' layers.Dense(64)(x)); Share makes one
// layer that several calls share.

// Call returns the output of a new Dense layer called on x.
func (d Dense) Call(x *Tensor) *Tensor { return callSpec(d, []*Tensor{x}) }

// Call returns the output of a new Conv2D layer called on x.
func (c Conv2D) Call(x *Tensor) *Tensor { return callSpec(c, []*Tensor{x}) }

// Call returns the output of a new MaxPool2D layer called on x.
func (p MaxPool2D) Call(x *Tensor) *Tensor { return callSpec(p, []*Tensor{x}) }

// Call returns the output of a new AvgPool2D layer called on x.
func (p AvgPool2D) Call(x *Tensor) *Tensor { return callSpec(p, []*Tensor{x}) }

// Call returns the output of a new Flatten layer called on x.
func (f Flatten) Call(x *Tensor) *Tensor { return callSpec(f, []*Tensor{x}) }

// Call returns the output of a new Reshape layer called on x.
func (rs Reshape) Call(x *Tensor) *Tensor { return callSpec(rs, []*Tensor{x}) }

// Call returns the output of a new Embedding layer called on ids.
func (e Embedding) Call(ids *Tensor) *Tensor { return callSpec(e, []*Tensor{ids}) }

// Call returns the output of a new Dropout layer called on x.
func (d Dropout) Call(x *Tensor) *Tensor { return callSpec(d, []*Tensor{x}) }

// Call returns the output of a new LayerNorm layer called on x.
func (l LayerNorm) Call(x *Tensor) *Tensor { return callSpec(l, []*Tensor{x}) }

// Call returns the output of a new BatchNorm layer called on x.
func (bn BatchNorm) Call(x *Tensor) *Tensor { return callSpec(bn, []*Tensor{x}) }

// Call returns the output of a new Activation layer of a called on x
// (nn.GELU.Call(x), Keras' layers.Activation("gelu")(x)).
func (a Activation) Call(x *Tensor) *Tensor { return callSpec(a, []*Tensor{x}) }

// Call returns the output of a new Activation layer called on x.
func (l ActivationLayer) Call(x *Tensor) *Tensor { return callSpec(l, []*Tensor{x}) }

// Call returns the output of a new GlobalAveragePooling1D layer called on
// x.
func (p GlobalAveragePooling1D) Call(x *Tensor) *Tensor { return callSpec(p, []*Tensor{x}) }

// Call returns the output of a new GlobalAveragePooling2D layer called on
// x.
func (p GlobalAveragePooling2D) Call(x *Tensor) *Tensor { return callSpec(p, []*Tensor{x}) }

// Call returns the output of a new PositionEmbedding layer called on x:
// the position embeddings, of x's shape.
func (p PositionEmbedding) Call(x *Tensor) *Tensor { return callSpec(p, []*Tensor{x}) }

// Call returns the output of a new TokenAndPositionEmbedding layer called
// on ids.
func (e TokenAndPositionEmbedding) Call(ids *Tensor) *Tensor { return callSpec(e, []*Tensor{ids}) }
