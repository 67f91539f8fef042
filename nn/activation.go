package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// Activation is a function applied to a layer's output, element by
// element except Softmax, with Keras' semantics. It is a Dense or Conv2D
// option, a layer of its own (a Spec, as ActivationLayer), and, through
// Apply, a function on the tf.Outputs of a layer's code.
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
	// GELU is x·Φ(x) = x/2·(1+erf(x/√2)), Keras' gelu (approximate=False).
	GELU
	// GELUTanh is x/2·(1+tanh(√(2/π)·(x+0.044715x³))), Keras' gelu with
	// approximate=True.
	GELUTanh
	// SiLU is x·sigmoid(x), Keras' silu (or swish).
	SiLU
	// Softmax is e^x/Σe^x over the last axis.
	Softmax
)

var activationNames = [...]string{
	Linear: "linear", ReLU: "relu", Tanh: "tanh", Sigmoid: "sigmoid",
	GELU: "gelu", GELUTanh: "gelu_approximate", SiLU: "silu", Softmax: "softmax",
}

// String returns the activation's Keras name ("gelu_approximate" for
// GELUTanh, which Keras names by an argument).
func (a Activation) String() string {
	if a.valid() {
		return activationNames[a]
	}
	return fmt.Sprintf("Activation(%d)", int(a))
}

func (a Activation) valid() bool { return a >= 0 && int(a) < len(activationNames) }

// check reports an activation that does not exist, or one that layer
// cannot apply to outputs of shape out (without the batch): a softmax
// over the batch.
func (a Activation) check(layer string, out []int64) error {
	if !a.valid() {
		return fmt.Errorf("%s: %v, expected one of the nn.Activation constants", layer, a)
	}
	if a == Softmax && len(out) == 0 {
		return fmt.Errorf("%s: softmax over the last axis of shape [-1] would mix the batch's examples; expected [batch, …, features]", layer)
	}
	return nil
}

// Apply returns a(x), built with b, in x's type.
func (a Activation) Apply(b *Builder, x tf.Output) tf.Output {
	switch a {
	case ReLU:
		return b.Relu(x)
	case Tanh:
		return b.Tanh(x)
	case Sigmoid:
		return b.Sigmoid(x)
	case GELU:
		return b.Gelu(x)
	case GELUTanh:
		return b.GeluTanh(x)
	case SiLU:
		return b.Silu(x)
	case Softmax:
		return b.Softmax(x)
	}
	return x
}

// Kind implements Spec: an Activation is a layer of its own, as
// ActivationLayer{Activation: a}.
func (a Activation) Kind() string { return ActivationLayer{}.Kind() }

// Build implements Spec.
func (a Activation) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	return ActivationLayer{Activation: a}.Build(sc, name, in, seed)
}

// ActivationLayer applies Activation to its input (Keras'
// layers.Activation; layers.Softmax is ActivationLayer{Activation:
// Softmax}). It has no variables.
type ActivationLayer struct {
	Activation Activation
}

// Kind implements Spec.
func (ActivationLayer) Kind() string { return "activation" }

// Build implements Spec.
func (l ActivationLayer) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	if err := l.Activation.check("Activation", in); err != nil {
		return nil, nil, err
	}
	return &activation{act: l.Activation, in: in}, in, nil
}

type activation struct {
	act Activation
	in  []int64
}

func (l *activation) Vars() []strategy.Variable { return nil }

func (l *activation) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), l.act.String())
	return l.act.Apply(b, x), b.Err()
}
