package nn

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Policy is a mixed-precision policy, as Keras' dtype policies name them:
// the type a model's variables are kept in (always float32) and the type
// its layers compute in. Under "mixed_bfloat16" and "mixed_float16" a
// Sequential casts each layer's floating-point input to the 16-bit type,
// layers cast their variables' reads to the type of their input (Keras'
// autocast), normalisation layers compute their statistics in float32,
// and the model's outputs are cast back to float32 before any loss. The
// gradients flow back through the casts (TensorFlow's Cast has a
// gradient), so optimizers update float32 variables with float32
// gradients.
//
// TensorFlow 2.18's CPU kernels cover every op of package nn in bfloat16
// and float16 (MatMul, Conv2D and its gradients, BiasAdd, Relu, Tanh,
// Sigmoid, MaxPool, AvgPool, Softmax and its cross-entropy, …), so no
// layer falls back to float32 for want of a kernel. Float16's range is
// narrow: gradients below 6e-8 underflow to zero, so train under
// mixed_float16 with loss scaling (optimizer.NewLossScale; see
// CheckOptimizer). Bfloat16 has float32's range and needs none.
//
// The zero Policy is Float32. A *Policy is a flag.Value.
type Policy struct {
	name    string
	compute tf.DataType
}

// The policies ParsePolicy knows.
var (
	// Float32 computes and keeps variables in float32.
	Float32 = Policy{name: "float32", compute: tf.Float}
	// MixedBfloat16 computes in bfloat16 and keeps variables in float32.
	MixedBfloat16 = Policy{name: "mixed_bfloat16", compute: tf.Bfloat16}
	// MixedFloat16 computes in float16 and keeps variables in float32; it
	// needs loss scaling.
	MixedFloat16 = Policy{name: "mixed_float16", compute: tf.Half}
)

var policies = []Policy{Float32, MixedBfloat16, MixedFloat16}

// PolicyNames lists the names ParsePolicy accepts.
func PolicyNames() []string {
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.name
	}
	return names
}

// ParsePolicy returns the policy named name: "float32", "mixed_bfloat16"
// or "mixed_float16".
func ParsePolicy(name string) (Policy, error) {
	for _, p := range policies {
		if p.name == name {
			return p, nil
		}
	}
	return Policy{}, fmt.Errorf("mixed-precision policy %q: expected one of %s", name, strings.Join(PolicyNames(), ", "))
}

// Name returns the policy's Keras name.
func (p Policy) Name() string {
	if p.name == "" {
		return Float32.name
	}
	return p.name
}

// String returns the policy's name.
func (p Policy) String() string { return p.Name() }

// Set implements flag.Value: it parses name as ParsePolicy does.
func (p *Policy) Set(name string) error {
	q, err := ParsePolicy(name)
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// ComputeDType returns the type layers compute in.
func (p Policy) ComputeDType() tf.DataType {
	if p.compute == 0 {
		return tf.Float
	}
	return p.compute
}

// VariableDType returns the type variables are kept in: float32.
func (p Policy) VariableDType() tf.DataType { return tf.Float }

// Mixed reports whether layers compute in a 16-bit type.
func (p Policy) Mixed() bool { return p.ComputeDType() != tf.Float }

// CheckOptimizer reports an error when opt cannot train a model under p:
// under mixed_float16, an optimizer that does not scale the loss
// (strategy.LossScaler, optimizer.NewLossScale), since float16 gradients
// below 6e-8 underflow to zero. To train without loss scaling anyway,
// give a LossScale whose scale is fixed at 1.
func (p Policy) CheckOptimizer(opt strategy.Optimizer) error {
	if p.ComputeDType() != tf.Half {
		return nil
	}
	if _, ok := opt.(strategy.LossScaler); ok {
		return nil
	}
	return fmt.Errorf("mixed-precision policy %s with optimizer %T, which does not scale the loss: float16 gradients below 6e-8 underflow to zero; "+
		"wrap the optimizer with optimizer.NewLossScale, or use %s, which needs no loss scaling", p.Name(), opt, MixedBfloat16.Name())
}

// isHalf reports whether dt is a 16-bit floating-point type.
func isHalf(dt tf.DataType) bool { return dt == tf.Half || dt == tf.Bfloat16 }

// readAs returns r's reads of vs cast to dtype, the type of the input of
// the layer that reads them (Keras' autocast variables).
func readAs(r strategy.Replica, dtype tf.DataType, b *Builder, vs ...strategy.Variable) ([]tf.Output, error) {
	out, err := readAll(r, vs...)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if graphutil.IsFloat(out[i].DataType()) && graphutil.IsFloat(dtype) {
			out[i] = b.Cast(out[i], dtype)
		}
	}
	return out, nil
}
