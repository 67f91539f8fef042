package nn_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// runModel builds m on s for float32 inputs of the given widths and
// returns its outputs on xs (one [batch][width] slice per input).
func runModel(t *testing.T, s *onedevice.Strategy, m *nn.Model, xs ...[][]float32) [][]float32 {
	t.Helper()
	spec := strategy.InputSpec{}
	names := []string{"a", "b", "c"}
	for i, x := range xs {
		spec[names[i]] = strategy.TensorSpec{DType: tf.Float, Shape: []int64{-1, int64(len(x[0]))}}
	}
	step, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		args := make([]tf.Output, len(xs))
		for i := range xs {
			args[i] = in[names[i]]
		}
		ys, err := m.Outputs(r, args, false)
		out := strategy.Outputs{}
		for i, y := range ys {
			out[names[i]] = y
		}
		return out, err
	})
	require.NoError(t, err)
	batch := map[string]*tf.Tensor{}
	for i, x := range xs {
		batch[names[i]], err = tf.NewTensor(x)
		require.NoError(t, err)
	}
	res, err := s.RunReplicas(context.Background(), step, []map[string]*tf.Tensor{batch}, len(xs[0]))
	require.NoError(t, err)
	var out [][]float32
	for i := range m.OutputCount() {
		out = append(out, tensorutil.Float32s(res[names[i]][0]))
	}
	return out
}

// dense computes x·w + b on the host, w of shape [in, out] flattened.
func dense(x []float32, w, b []float32) []float32 {
	out := append([]float32(nil), b...)
	for j := range out {
		for i := range x {
			out[j] += x[i] * w[i*len(out)+j]
		}
	}
	return out
}

func values(t *testing.T, s *onedevice.Strategy, vs []strategy.Variable) map[string][]float32 {
	t.Helper()
	vals, err := strategy.ReadVariables(context.Background(), s, vs)
	require.NoError(t, err)
	out := map[string][]float32{}
	for i, v := range vals {
		out[vs[i].Name()] = v.Float32
	}
	return out
}

// A model with a skip connection computes x + relu(x·W + b), its
// variables are the dense layer's, and Summary counts them.
func TestFunctionalSkipConnection(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		x := nn.Input(3)
		h := nn.Dense{Units: 3, Activation: nn.ReLU}.Call(x)
		m, err = nn.NewModel(sc, "res", []*nn.Tensor{x}, []*nn.Tensor{nn.Add{}.Call(x, h)}, nn.WithSeed(7))
		return err
	}))
	names := []string{}
	for _, v := range m.Vars() {
		names = append(names, v.Name())
	}
	assert.Equal(t, []string{"res/dense_0/kernel", "res/dense_0/bias"}, names)

	x := [][]float32{{1, -2, 0.5}, {0, 3, -1}}
	got := runModel(t, s, m, x)[0]
	w := values(t, s, m.Vars())
	for i, row := range x {
		h := dense(row, w["res/dense_0/kernel"], w["res/dense_0/bias"])
		for j := range h {
			assert.InDelta(t, row[j]+max(h[j], 0), got[i*3+j], 1e-6, "example %d, feature %d", i, j)
		}
	}
	sum := m.Summary()
	for _, want := range []string{`Model: "res"`, "input_0 (input)", "dense_0 (dense)", "(None, 3)", "add_0 (add)", "input_0, dense_0",
		"Total params: 12", "Trainable params: 12", "Non-trainable params: 0"} {
		assert.Contains(t, sum, want)
	}
}

// A layer shared by two calls has one set of variables and computes the
// same function on both inputs; a model of two inputs and two outputs
// returns them in order.
func TestFunctionalSharedLayer(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		a, b := nn.Input(3).Named("left"), nn.Input(3).Named("right")
		enc := nn.Share(nn.Dense{Units: 2})
		ea, eb := enc.Call(a), enc.Call(b)
		m, err = nn.NewModel(sc, "siamese", []*nn.Tensor{a, b}, []*nn.Tensor{nn.Concatenate{}.Call(ea, eb), nn.Multiply{}.Call(ea, eb)})
		return err
	}))
	require.Len(t, m.Variables(), 2)
	w := values(t, s, m.Vars())
	a, b := [][]float32{{1, 2, 3}}, [][]float32{{-1, 0.5, 2}}
	got := runModel(t, s, m, a, b)
	ea := dense(a[0], w["siamese/dense_0/kernel"], w["siamese/dense_0/bias"])
	eb := dense(b[0], w["siamese/dense_0/kernel"], w["siamese/dense_0/bias"])
	assert.InDeltaSlice(t, append(ea, eb...), got[0], 1e-6, "concatenated encodings")
	assert.InDeltaSlice(t, []float32{ea[0] * eb[0], ea[1] * eb[1]}, got[1], 1e-6, "their product")
	assert.Contains(t, m.Summary(), "left, right")
}

// A model called as a layer of another shares its variables: the outer
// model has no variables of its own, and applying it twice is applying
// the inner model twice.
func TestFunctionalNestedModel(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var inner, outer *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		x := nn.Input(2)
		if inner, err = nn.NewModel(sc, "block", []*nn.Tensor{x}, []*nn.Tensor{nn.Dense{Units: 2, Activation: nn.Tanh}.Call(x)}); err != nil {
			return err
		}
		u := nn.Input(2)
		outer, err = nn.NewModel(sc, "twice", []*nn.Tensor{u}, []*nn.Tensor{inner.Call(inner.Call(u))})
		return err
	}))
	assert.Equal(t, inner.Variables(), outer.Variables())
	x := [][]float32{{0.3, -0.7}}
	once := runModel(t, s, inner, x)[0]
	want := runModel(t, s, inner, [][]float32{once})[0]
	assert.InDeltaSlice(t, want, runModel(t, s, outer, x)[0], 1e-6)
	assert.Contains(t, outer.Summary(), "block (model)")
}

// Mistakes in a definition are errors when the model is built, naming
// the layer, the shapes and what was expected.
func TestFunctionalBuildErrors(t *testing.T) {
	x, other := nn.Input(3), nn.Input(4)
	shared := nn.Share(nn.Dense{Units: 2})
	cases := []struct {
		name    string
		in, out []*nn.Tensor
		want    string
	}{
		{"disconnected", []*nn.Tensor{x}, []*nn.Tensor{nn.Add{}.Call(x, nn.Dense{Units: 3}.Call(other))},
			`nn: model "m": output 0: depends on an input of shape [-1 4] that is not among the model's inputs`},
		{"no inputs", []*nn.Tensor{x}, []*nn.Tensor{nn.Add{}.Call()}, "output 0 does not depend on the model's inputs"},
		{"widths", []*nn.Tensor{x}, []*nn.Tensor{nn.Add{}.Call(x, nn.Dense{Units: 4}.Call(x))},
			"layer m/add_0: Add: inputs of shapes [[3] [4]], expected one shape"},
		{"shared", []*nn.Tensor{x, other}, []*nn.Tensor{shared.Call(x), shared.Call(other)},
			"layer m/dense_0, called again: inputs of shapes [[4]], expected [[3]]"},
		{"names", []*nn.Tensor{x}, []*nn.Tensor{nn.Named("proj", nn.Dense{Units: 3}).Call(nn.Named("proj", nn.Dense{Units: 3}).Call(x))},
			"layer m/proj: two layers of the model have that name"},
		{"arity", []*nn.Tensor{x}, []*nn.Tensor{nn.Share(nn.Dense{Units: 3}).Call(x, x)}, "layer m/dense_0: called on 2 inputs [[3] [3]], expected one"},
		{"concatenate", []*nn.Tensor{x, other}, []*nn.Tensor{nn.Concatenate{Axis: 2}.Call(x, other)}, "Concatenate: Axis 2, expected -1 to -1 or 1 to 1 for inputs of shape [-1 3]"},
		{"no outputs", []*nn.Tensor{x}, nil, "1 inputs and 0 outputs"},
	}
	for _, c := range cases {
		s, err := onedevice.New()
		require.NoError(t, err)
		err = s.Scope(func(sc strategy.Scope) error {
			_, err := nn.NewModel(sc, "m", c.in, c.out)
			return err
		})
		assert.ErrorContains(t, err, c.want, c.name)
		s.Close()
	}
}
