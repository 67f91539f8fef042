package nn_test

import (
	"context"
	"flag"
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// ParsePolicy knows Keras' three names and lists them when given another;
// a *Policy is a flag.
func TestParsePolicy(t *testing.T) {
	for _, want := range []nn.Policy{nn.Float32, nn.MixedBfloat16, nn.MixedFloat16} {
		got, err := nn.ParsePolicy(want.Name())
		require.NoError(t, err)
		assert.Equal(t, want, got)
		assert.Equal(t, tf.Float, got.VariableDType())
	}
	assert.Equal(t, tf.Bfloat16, nn.MixedBfloat16.ComputeDType())
	assert.Equal(t, tf.Half, nn.MixedFloat16.ComputeDType())
	assert.Equal(t, "float32", nn.Policy{}.Name(), "the zero policy")
	assert.Equal(t, tf.Float, nn.Policy{}.ComputeDType())
	_, err := nn.ParsePolicy("mixed_fp8")
	assert.EqualError(t, err, `mixed-precision policy "mixed_fp8": expected one of float32, mixed_bfloat16, mixed_float16`)

	var p nn.Policy
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(&p, "mixed-precision", "policy")
	require.NoError(t, fs.Parse([]string{"-mixed-precision", "mixed_bfloat16"}))
	assert.Equal(t, nn.MixedBfloat16, p)
	assert.ErrorContains(t, fs.Parse([]string{"-mixed-precision", "float64"}), `"float64": expected one of float32, mixed_bfloat16, mixed_float16`)
}

// Under mixed_float16 an optimizer without loss scaling is refused,
// naming the policy; with loss scaling, or under the other policies, any
// optimizer is accepted.
func TestCheckOptimizer(t *testing.T) {
	sgd := optimizer.NewSGD(nil)
	assert.ErrorContains(t, nn.MixedFloat16.CheckOptimizer(sgd), "mixed-precision policy mixed_float16 with optimizer *optimizer.SGD, which does not scale the loss")
	ls, err := optimizer.NewLossScale(sgd)
	require.NoError(t, err)
	assert.NoError(t, nn.MixedFloat16.CheckOptimizer(ls))
	assert.NoError(t, nn.MixedBfloat16.CheckOptimizer(sgd))
	assert.NoError(t, nn.Float32.CheckOptimizer(sgd))
}

// mixedModel has a layer of every kind that computes.
func mixedModel(sc strategy.Scope) (*nn.Sequential, error) {
	return nn.NewSequential(sc, "m", []int64{64}, 1,
		nn.Reshape{Shape: []int64{8, 8, 1}},
		nn.Conv2D{Filters: 4, Kernel: 3, Padding: nn.Same, Activation: nn.ReLU},
		nn.MaxPool2D{Size: 2},
		nn.BatchNorm{},
		nn.AvgPool2D{Size: 2},
		nn.Flatten{},
		nn.Dense{Units: 16, Activation: nn.Tanh},
		nn.Dropout{Rate: 0.25},
		nn.LayerNorm{},
		nn.Dense{Units: 3, Activation: nn.Sigmoid},
	)
}

func digitsLike(n int) [][]float32 {
	x := make([][]float32, n)
	for i := range x {
		x[i] = make([]float32, 64)
		for j := range x[i] {
			x[i][j] = float32((i*31+j*7)%17) / 4
		}
	}
	return x
}

// Under a mixed policy the same model, on the same float32 variables,
// computes in 16 bits — its outputs differ from float32's by 16-bit
// rounding, and only by that — and returns float32; a training step
// under it updates the float32 variables and BatchNorm's float32 moving
// statistics.
func TestMixedPolicyComputesIn16BitsOnFloat32Variables(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = mixedModel(sc)
		return err
	}))
	policies := map[string]nn.Policy{"float32": nn.Float32, "bfloat16": nn.MixedBfloat16, "float16": nn.MixedFloat16}
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 64}}}
	eval, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		out := strategy.Outputs{}
		for name, p := range policies {
			y, err := m.WithPolicy(p).Apply(r, in["x"], false)
			if err != nil {
				return nil, err
			}
			assert.Equal(t, tf.Float, y.DataType(), "%s outputs", name)
			out[name] = y
		}
		return out, nil
	})
	require.NoError(t, err)
	x, err := tf.NewTensor(digitsLike(8))
	require.NoError(t, err)
	res, err := s.RunReplicas(ctx, eval, []map[string]*tf.Tensor{{"x": x}}, 8)
	require.NoError(t, err)
	want := tensorutil.Float32s(res["float32"][0])
	for name, tol := range map[string]float64{"bfloat16": 0.05, "float16": 0.01} {
		got := tensorutil.Float32s(res[name][0])
		d := maxDiff(want, got)
		assert.Less(t, d, tol, "%s outputs against float32's", name)
		assert.Greater(t, d, 1e-6, "%s outputs are float32's: not computed in 16 bits", name)
	}

	mixed := m.WithPolicy(nn.MixedBfloat16)
	assert.Equal(t, nn.Float32, m.Policy(), "WithPolicy leaves the model unchanged")
	train, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		y, err := mixed.Apply(r, in["x"], true)
		if err != nil {
			return nil, err
		}
		s := r.Scope().SubScope("mse")
		loss := r.AverageLoss(nn.MeanSquaredError(s, y, op.ZerosLike(s.SubScope("zeros"), y)))
		return strategy.Outputs{"loss": loss}, r.Minimize(optimizer.NewSGD(optimizer.Constant(0.5)), loss, m.Vars())
	})
	require.NoError(t, err)
	before := map[string][]float32{}
	for _, v := range s.Variables() {
		require.Contains(t, []tf.DataType{tf.Float, tf.Int64}, v.DType(), "variable %s", v.Name())
		if v.DType() == tf.Float {
			val, err := s.Value(ctx, v)
			require.NoError(t, err)
			before[v.Name()] = tensorutil.Float32s(val)
		}
	}
	_, err = s.RunReplicas(ctx, train, []map[string]*tf.Tensor{{"x": x}}, 8)
	require.NoError(t, err)
	for _, v := range s.Variables() {
		if v.DType() != tf.Float {
			continue
		}
		val, err := s.Value(ctx, v)
		require.NoError(t, err)
		after := tensorutil.Float32s(val)
		for _, f := range after {
			require.False(t, math.IsNaN(float64(f)) || math.IsInf(float64(f), 0), "%s: %v", v.Name(), after)
		}
		assert.Greater(t, maxDiff(before[v.Name()], after), 0.0, "%s moves", v.Name())
	}
}
