package strategy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tensorutil"
)

// VariableValue is a variable's value copied into Go memory, for reports,
// checks and export: exactly one of Float32 and Float64 is set, holding the
// elements row-major.
type VariableValue struct {
	// Name is the variable's name.
	Name string
	// Shape is the variable's shape.
	Shape []int64
	// Float32 holds the elements of a float32 variable.
	Float32 []float32
	// Float64 holds the elements of a float64 variable.
	Float64 []float64
}

// ValueReader reads a variable's value outside any replica, as every
// strategy's Value does, the parameter-server one included.
type ValueReader interface {
	Value(ctx context.Context, v Variable) (*tf.Tensor, error)
}

// ReadVariables reads vars as s.Value does — the primary copy of a mirrored
// variable, the aggregate of an OnRead one, all shards of a parameter-server
// variable — into Go memory. Only float32 and float64 variables can be read;
// any other type is an error naming the variable.
func ReadVariables(ctx context.Context, s ValueReader, vars []Variable) ([]VariableValue, error) {
	for _, v := range vars {
		if dt := v.DType(); dt != tf.Float && dt != tf.Double {
			return nil, fmt.Errorf("strategy: ReadVariables: variable %q has dtype %s, expected float32 or float64", v.Name(), graphutil.DTypeName(dt))
		}
	}
	ts, err := readAll(ctx, s, vars)
	if err != nil {
		return nil, err
	}
	out := make([]VariableValue, 0, len(vars))
	for i, v := range vars {
		out = append(out, VariableValue{
			Name: v.Name(), Shape: ts[i].Shape(),
			Float32: tensorutil.Float32s(ts[i]), Float64: tensorutil.Float64s(ts[i]),
		})
	}
	return out, nil
}

// readAll reads vars in one run where s can (the in-graph strategies'
// Values), one by one otherwise.
func readAll(ctx context.Context, s ValueReader, vars []Variable) ([]*tf.Tensor, error) {
	if vs, ok := s.(interface {
		Values(context.Context, []Variable) ([]*tf.Tensor, error)
	}); ok {
		ts, err := vs.Values(ctx, vars)
		if err != nil {
			return nil, fmt.Errorf("strategy: ReadVariables: %w", err)
		}
		return ts, nil
	}
	ts := make([]*tf.Tensor, len(vars))
	for i, v := range vars {
		t, err := s.Value(ctx, v)
		if err != nil {
			return nil, fmt.Errorf("strategy: ReadVariables: variable %q: %w", v.Name(), err)
		}
		ts[i] = t
	}
	return ts, nil
}

// GlobalNorm returns the L2 norm of all the values together, the square root
// of the sum of every element's square, summed in float64: what
// tf.linalg.global_norm computes and what gradient clipping by global norm
// compares.
func GlobalNorm(values []VariableValue) float64 {
	var s float64
	for _, v := range values {
		s += tensorutil.SumSquares(v.Float32) + tensorutil.SumSquares(v.Float64)
	}
	return math.Sqrt(s)
}

// Fingerprint returns the SHA-256, in hex, of every element of every
// value with its name and shape: equal fingerprints are the same model bit
// for bit. Runs with the same seed, data and topology end with equal ones,
// and, under a strategy's WithDeterministic, any topology does.
func Fingerprint(values []VariableValue) string {
	h := sha256.New()
	for _, v := range values {
		fmt.Fprintf(h, "%q %v\n", v.Name, v.Shape)
		// Writing float slices to a hash cannot fail.
		_ = binary.Write(h, binary.LittleEndian, v.Float32)
		_ = binary.Write(h, binary.LittleEndian, v.Float64)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TensorValue returns t's value in Go memory, as graft's Tensor.Value does
// (a scalar, or nested slices for higher ranks), or nil for a nil t (what
// Result.Reduced returns for an unknown name). Read fetched tensors with it
// rather than t.Value(): graft reads the tensor's memory after its last use
// of t, so in out.Reduced("loss").Value(), where nothing else refers to the
// tensor, the collector may free that memory while it is read. TensorValue
// keeps t alive until its value is copied.
func TensorValue(t *tf.Tensor) any {
	if t == nil {
		return nil
	}
	return tensorutil.Value(t)
}

// MaxDiff compares two readings of the same variables element by element
// and returns the largest difference, relative to the largest magnitude
// in a's value of that variable (so that an element near zero is compared
// at its variable's scale), with the variable's name and the element's
// index. It returns +Inf where a and b hold other variables, in another
// order, or of other sizes, or where an element is NaN in one of them.
func MaxDiff(a, b []VariableValue) (diff float64, name string, index int) {
	if len(a) != len(b) {
		return math.Inf(1), "", -1
	}
	for k := range a {
		x, y := a[k].floats(), b[k].floats()
		if a[k].Name != b[k].Name || len(x) != len(y) {
			return math.Inf(1), a[k].Name, -1
		}
		scale := 0.0
		for _, v := range x {
			scale = max(scale, math.Abs(v))
		}
		for i := range x {
			d := math.Abs(x[i]-y[i]) / max(scale, math.SmallestNonzeroFloat64)
			if math.IsNaN(d) {
				return math.Inf(1), a[k].Name, i
			}
			if d > diff {
				diff, name, index = d, a[k].Name, i
			}
		}
	}
	return diff, name, index
}

// floats returns the elements as float64.
func (v VariableValue) floats() []float64 {
	if v.Float64 != nil {
		return v.Float64
	}
	out := make([]float64, len(v.Float32))
	for i, x := range v.Float32 {
		out[i] = float64(x)
	}
	return out
}
