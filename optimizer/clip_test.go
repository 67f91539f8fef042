package optimizer_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// trainPair runs one update per element of grads of two variables, a (2
// elements, initially 1) and b (3 elements, initially 1), under opt with
// the loss sum(a*ga) + sum(b*gb), so each step's gradients are the fed ga
// and gb; it returns a and b concatenated after each step.
func trainPair(t *testing.T, opt strategy.Optimizer, grads [][]float32) [][]float32 {
	t.Helper()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var vars []strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) error {
		for _, v := range []struct {
			name string
			n    int64
		}{{"a", 2}, {"b", 3}} {
			w := make([]float32, v.n)
			for i := range w {
				w[i] = 1
			}
			ones, err := tf.NewTensor(w)
			if err != nil {
				return err
			}
			x, err := sc.Variable(v.name, tf.Float, []int64{v.n}, strategy.Constant(ones))
			if err != nil {
				return err
			}
			vars = append(vars, x)
		}
		return nil
	}))
	spec := strategy.InputSpec{"ga": {DType: tf.Float, Shape: []int64{2}}, "gb": {DType: tf.Float, Shape: []int64{3}}}
	step, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope().SubScope("loss")
		dot := func(name string, v strategy.Variable, g tf.Output) tf.Output {
			ds := sc.SubScope(name)
			return op.Sum(ds, op.Mul(ds.SubScope("mul"), strategy.MustRead(rc, v), g), op.Const(ds.SubScope("axis"), int32(0)))
		}
		loss := op.Add(sc, dot("a", vars[0], in["ga"]), dot("b", vars[1], in["gb"]))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, vars)
	})
	require.NoError(t, err)
	var out [][]float32
	for _, g := range grads {
		ga, err := tf.NewTensor(g[:2])
		require.NoError(t, err)
		gb, err := tf.NewTensor(g[2:])
		require.NoError(t, err)
		_, err = s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"ga": ga, "gb": gb}}, 1)
		require.NoError(t, err)
		var w []float32
		for _, v := range vars {
			x, err := s.Value(ctx, v)
			require.NoError(t, err)
			w = append(w, x.Value().([]float32)...)
		}
		out = append(out, w)
	}
	return out
}

// Gradients of a (2 elements) then b (3): global norms 5, 0.5 and 13.
var pairGrads = [][]float32{{3, 0, 0, 4, 0}, {0.3, 0, -0.4, 0, 0}, {-3, 4, 12, 0, 0}}

// ClipByGlobalNorm scales every variable's gradient by
// clip / max(global norm, clip), the norm taken over all variables
// together (tf.clip_by_global_norm), and leaves gradients whose norm is
// below the clip alone; ClipByValue clips each element of each gradient to
// [-clip, clip].
func TestClipping(t *testing.T) {
	const lr = 0.1
	cases := []struct {
		name    string
		clip    func(strategy.Optimizer, float32) (*optimizer.Clipped, error)
		c       float64
		clipped func(g []float32, c float64) []float64
	}{
		{"ClipByGlobalNorm", optimizer.ClipByGlobalNorm, 1, func(g []float32, c float64) []float64 {
			var sq float64
			for _, x := range g {
				sq += float64(x) * float64(x)
			}
			out := make([]float64, len(g))
			for i, x := range g {
				out[i] = float64(x) * c / math.Max(math.Sqrt(sq), c)
			}
			return out
		}},
		{"ClipByValue", optimizer.ClipByValue, 0.5, func(g []float32, c float64) []float64 {
			out := make([]float64, len(g))
			for i, x := range g {
				out[i] = math.Max(-c, math.Min(c, float64(x)))
			}
			return out
		}},
	}
	for _, tc := range cases {
		opt, err := tc.clip(optimizer.NewSGD(optimizer.Constant(lr)), float32(tc.c))
		require.NoError(t, err)
		got := trainPair(t, opt, pairGrads)
		w := []float64{1, 1, 1, 1, 1}
		for k, g := range pairGrads {
			for i, x := range tc.clipped(g, tc.c) {
				w[i] -= lr * x
				assert.InDelta(t, w[i], got[k][i], 1e-6, "%s: step %d element %d", tc.name, k, i)
			}
		}
	}
}

// A gradient with an infinite element makes the global norm infinite, and
// every variable becomes NaN, as with tf.clip_by_global_norm: the step is
// visibly broken rather than silently scaled to zero.
func TestClipByGlobalNormOfInfiniteGradient(t *testing.T) {
	opt, err := optimizer.ClipByGlobalNorm(optimizer.NewSGD(optimizer.Constant(0.1)), 1)
	require.NoError(t, err)
	got := trainPair(t, opt, [][]float32{{float32(math.Inf(1)), 0, 0, 0, 0}})
	for i, x := range got[0] {
		assert.True(t, math.IsNaN(float64(x)), "element %d is %v", i, x)
	}
}

// Clip values that are not positive and finite, and a nil inner optimizer,
// are errors naming the value.
func TestClipBadInput(t *testing.T) {
	sgd := optimizer.NewSGD(nil)
	for _, c := range []float32{0, -1, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		_, err := optimizer.ClipByGlobalNorm(sgd, c)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "clipNorm is "+fmt.Sprint(c))
		_, err = optimizer.ClipByValue(sgd, c)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "clip is "+fmt.Sprint(c))
	}
	_, err := optimizer.ClipByGlobalNorm(nil, 1)
	assert.ErrorContains(t, err, "nil inner optimizer")
	_, err = optimizer.ClipByValue(nil, 1)
	assert.ErrorContains(t, err, "nil inner optimizer")
}
