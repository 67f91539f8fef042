// Package nn has the layers, initialisers and losses of tfdist models,
// built from TensorFlow ops whose gradients TensorFlow's C++ registry knows,
// on the model contract of package strategy, so that one model trains
// under every strategy: Dense, Conv2D, MaxPool2D, AvgPool2D, Flatten,
// Embedding, Dropout, LayerNorm and BatchNorm, composed by Sequential,
// which computes in float32 or, under a mixed-precision Policy, in
// bfloat16 or float16 on float32 variables.
// Initial values and dropout masks come from stateless generators with
// explicit seeds, so every replica and every worker computes the same
// ones, and runs repeat.
package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// Activation is applied to a layer's output.
type Activation int

const (
	// Linear applies nothing.
	Linear Activation = iota
	// ReLU is max(x, 0).
	ReLU
	// Tanh is the hyperbolic tangent.
	Tanh
	// Sigmoid is 1/(1+e^-x).
	Sigmoid
)

func (a Activation) apply(b *Builder, x tf.Output) tf.Output {
	switch a {
	case ReLU:
		return b.Relu(x)
	case Tanh:
		return b.Tanh(x)
	case Sigmoid:
		return b.Sigmoid(x)
	}
	return x
}

// Dense is a fully connected layer y = act(x·kernel + bias) on inputs
// [batch, n]. Its kernel is Glorot-initialised, its bias zero. It computes
// in its input's type, its float32 variables read cast to it (see Policy).
type Dense struct {
	Units      int
	Activation Activation
}

// Kind implements Spec.
func (Dense) Kind() string { return "dense" }

// Build implements Spec.
func (d Dense) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if len(in) != 1 {
		return nil, nil, fmt.Errorf("Dense: input shape %v, expected [batch, features] (Flatten first)", append([]int64{-1}, in...))
	}
	if d.Units < 1 {
		return nil, nil, fmt.Errorf("Dense: Units %d, expected at least 1", d.Units)
	}
	w, err := sc.Variable(name+"/kernel", tf.Float, []int64{in[0], int64(d.Units)}, GlorotUniform(seed))
	if err != nil {
		return nil, nil, err
	}
	b, err := sc.Variable(name+"/bias", tf.Float, []int64{int64(d.Units)}, strategy.Zeros())
	if err != nil {
		return nil, nil, err
	}
	return &dense{w: w, b: b, in: in, act: d.Activation}, []int64{int64(d.Units)}, nil
}

type dense struct {
	w, b strategy.Variable
	in   []int64
	act  Activation
}

func (d *dense) Vars() []strategy.Variable { return []strategy.Variable{d.w, d.b} }

func (d *dense) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, d.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "dense")
	wb, err := readAs(r, x.DataType(), b, d.w, d.b)
	if err != nil {
		return tf.Output{}, err
	}
	return d.act.apply(b, b.Add(b.MatMul(x, wb[0]), wb[1])), b.Err()
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
