// Package nn has the layers, activations, initialisers and losses of
// tfdist models, with Keras' names and semantics, built from TensorFlow
// ops whose gradients TensorFlow's C++ registry knows, on the model
// contract of package strategy, so that one model trains under every
// strategy. Layers: Dense (over the last axis, of any rank), Conv2D,
// MaxPool2D, AvgPool2D, GlobalAveragePooling1D and 2D, Flatten, Reshape,
// Embedding, PositionEmbedding, TokenAndPositionEmbedding, Dropout,
// LayerNorm (over any axis), BatchNorm, Add, Multiply, Concatenate, and
// the activations ReLU, GELU (exact and tanh), SiLU, Softmax, Sigmoid and
// Tanh, as a Dense or Conv2D option or a layer of their own. A Model
// composes layers from its inputs to its outputs (Input, each layer's
// Call, NewModel), a Sequential in a line; both compute in float32 or,
// under a mixed-precision Policy, in bfloat16 or float16 on float32
// variables.
// Initial values and dropout masks come from stateless generators with
// explicit seeds, so every replica and every worker computes the same
// ones, and runs repeat.
package nn

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// Dense is a fully connected layer y = act(x·kernel + bias) over the
// last axis of its inputs, as Keras' Dense: [batch, …, n] gives [batch,
// …, Units]. Its kernel [n, Units] is Glorot-initialised, its bias zero;
// NoBias leaves the bias out (Keras' use_bias=False). It computes in its
// input's type, its float32 variables read cast to it (see Policy).
type Dense struct {
	Units      int
	Activation Activation
	NoBias     bool
}

// Kind implements Spec.
func (Dense) Kind() string { return "dense" }

// Build implements Spec.
func (d Dense) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if len(in) == 0 || in[len(in)-1] < 0 {
		return nil, nil, fmt.Errorf("Dense: input shape %v, expected [batch, …, features] with a known number of features", append([]int64{-1}, in...))
	}
	if d.Units < 1 {
		return nil, nil, fmt.Errorf("Dense: Units %d, expected at least 1", d.Units)
	}
	out := append(slices.Clone(in[:len(in)-1]), int64(d.Units))
	if err := d.Activation.check("Dense", out); err != nil {
		return nil, nil, err
	}
	kb, err := newKernelBias(sc, name, []int64{in[len(in)-1], int64(d.Units)}, GlorotUniform(seed), d.NoBias)
	if err != nil {
		return nil, nil, err
	}
	return &dense{kernelBias: kb, in: in, act: d.Activation}, out, nil
}

type dense struct {
	kernelBias
	in  []int64
	act Activation
}

func (d *dense) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, d.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "dense")
	w, addBias, err := d.read(r, b, x.DataType(), b.BiasAdd)
	if err != nil {
		return tf.Output{}, err
	}
	return d.act.Apply(b, addBias(b.MatMulLast(x, w))), b.Err()
}

// kernelBias is a layer's kernel and its bias, one per output unit (the
// last axis of the kernel), or none.
type kernelBias struct {
	w, b strategy.Variable
}

// newKernelBias creates the kernel "<name>/kernel" of shape kshape and,
// unless noBias, the zero bias "<name>/bias".
func newKernelBias(sc strategy.Scope, name string, kshape []int64, init strategy.Initializer, noBias bool) (kernelBias, error) {
	w, err := sc.Variable(name+"/kernel", tf.Float, kshape, init)
	if err != nil || noBias {
		return kernelBias{w: w}, err
	}
	b, err := sc.Variable(name+"/bias", tf.Float, kshape[len(kshape)-1:], strategy.Zeros())
	return kernelBias{w: w, b: b}, err
}

// Vars returns the kernel and the bias.
func (kb kernelBias) Vars() []strategy.Variable {
	if kb.b == nil {
		return []strategy.Variable{kb.w}
	}
	return []strategy.Variable{kb.w, kb.b}
}

// read returns the kernel read as dtype and a function adding the bias
// (as dtype) to its argument with add, or returning it where there is no
// bias.
func (kb kernelBias) read(r strategy.Replica, b *Builder, dtype tf.DataType,
	add func(y, bias tf.Output) tf.Output) (tf.Output, func(tf.Output) tf.Output, error) {
	vs, err := readAs(r, dtype, b, kb.Vars()...)
	if err != nil {
		return tf.Output{}, nil, err
	}
	if len(vs) == 1 {
		return vs[0], func(y tf.Output) tf.Output { return y }, nil
	}
	return vs[0], func(y tf.Output) tf.Output { return add(y, vs[1]) }, nil
}

// MLP is a stack of dense layers: ReLU between them, linear at the end.
type MLP struct {
	*Sequential
}

// NewMLP creates an MLP with the given layer sizes (sizes[0] inputs,
// sizes[len-1] outputs), named name/dense_0, name/dense_1, …; layer i is
// seeded with seed+i.
func NewMLP(sc strategy.Scope, name string, sizes []int, seed int64) (*MLP, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("NewMLP: sizes %v, expected at least inputs and outputs", sizes)
	}
	var specs []Spec
	for i := 1; i < len(sizes); i++ {
		act := ReLU
		if i+1 == len(sizes) {
			act = Linear
		}
		specs = append(specs, Dense{Units: sizes[i], Activation: act})
	}
	m, err := NewSequential(sc, name, []int64{int64(sizes[0])}, seed, specs...)
	if err != nil {
		return nil, err
	}
	return &MLP{m}, nil
}

// Apply builds the network for one replica and returns the logits (an MLP
// behaves the same in training and inference).
func (m *MLP) Apply(r strategy.Replica, x tf.Output) (tf.Output, error) {
	return m.Sequential.Apply(r, x, true)
}
