package nn_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

type bnOutcome struct {
	y            [][]float32 // per step, the global batch's outputs in order
	mean, varnce []float32
}

// runBatchNorm applies a BatchNorm in training mode to three global
// batches of 16 examples of 3 features, split evenly among e's replicas.
func runBatchNorm(t *testing.T, e testmodel.Engine, sync bool) bnOutcome {
	t.Helper()
	ctx := context.Background()
	var m *nn.Sequential
	require.NoError(t, e.Scope(func(sc strategy.Scope) (err error) {
		m, err = nn.NewSequential(sc, "bn", []int64{3}, 1, nn.BatchNorm{Momentum: 0.9, Synchronized: sync})
		return err
	}))
	step, err := e.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 3}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			y, err := m.Apply(r, in["x"], true)
			return strategy.Outputs{"y": y}, err
		})
	require.NoError(t, err)
	const gb = 16
	n := e.NumLocalReplicas()
	var out bnOutcome
	for k := range 3 {
		rows := make([][]float32, gb)
		for i := range rows {
			// Features of different scales and means, and batches
			// that differ from step to step.
			rows[i] = []float32{float32((i*7+k*3)%11) - 2, float32(i*i%13) * 0.5, float32(k+1) * float32(i%5)}
		}
		feeds := make([]map[string]*tf.Tensor, n)
		for r := range n {
			x, err := tf.NewTensor(rows[r*gb/n : (r+1)*gb/n])
			require.NoError(t, err)
			feeds[r] = map[string]*tf.Tensor{"x": x}
		}
		res, err := e.RunReplicas(ctx, step, feeds, gb)
		require.NoError(t, err)
		var y []float32
		for _, t := range res["y"] {
			y = append(y, tensorutil.Float32s(t)...)
		}
		out.y = append(out.y, y)
	}
	vars := map[string]strategy.Variable{}
	for _, v := range e.Variables() {
		vars[v.Name()] = v
	}
	mean, err := e.Value(ctx, vars["bn/batch_norm_0/moving_mean"])
	require.NoError(t, err)
	variance, err := e.Value(ctx, vars["bn/batch_norm_0/moving_variance"])
	require.NoError(t, err)
	out.mean, out.varnce = tensorutil.Float32s(mean), tensorutil.Float32s(variance)
	return out
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return 1e9
	}
	d := 0.0
	for i := range a {
		d = max(d, float64(a[i]-b[i]), float64(b[i]-a[i]))
	}
	return d
}

// Synchronized BatchNorm on 4 replicas normalises, and moves its
// statistics, exactly as BatchNorm on one device with the global batch;
// unsynchronized, each replica uses its own quarter and the results
// differ.
func TestSynchronizedBatchNormMatchesOneDevice(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want := runBatchNorm(t, def, false)

	for _, sync := range []bool{true, false} {
		t.Run(fmt.Sprintf("synchronized=%v", sync), func(t *testing.T) {
			s, err := mirrored.New(mirrored.WithLogicalCPUs(4))
			require.NoError(t, err)
			defer s.Close()
			got := runBatchNorm(t, s, sync)
			diff := 0.0
			for k := range want.y {
				diff = max(diff, maxDiff(want.y[k], got.y[k]))
			}
			diff = max(diff, maxDiff(want.mean, got.mean), maxDiff(want.varnce, got.varnce))
			if sync {
				assert.Less(t, diff, 1e-5, "outputs and moving statistics")
			} else {
				assert.Greater(t, diff, 1e-2, "per-replica statistics differ from the global batch's")
			}
		})
	}
}

// A layer given an input it cannot take fails at build time, naming the
// layer, the input's shape and the shape it expected.
func TestLayerBuildErrors(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	cases := []struct {
		in   []int64
		spec nn.Spec
		want string
	}{
		{[]int64{8, 8, 1}, nn.Conv2D{Filters: 4, Kernel: 9}, "layer m/conv2d_0: Conv2D: window 9 with VALID padding does not fit input [-1 8 8 1]"},
		{[]int64{8, 8, 1}, nn.Conv2D{Filters: 4, Kernel: 3, Strides: -1}, "layer m/conv2d_0: Conv2D: window 3, stride -1"},
		{[]int64{64}, nn.Conv2D{Filters: 4, Kernel: 3}, "expected [batch, height, width, channels]"},
		{[]int64{8, -1}, nn.Dense{Units: 3}, "layer m/dense_0: Dense: input shape [-1 8 -1], expected [batch, …, features] with a known number of features"},
		{[]int64{}, nn.Dense{Units: 3}, "layer m/dense_0: Dense: input shape [-1], expected [batch, …, features]"},
		{[]int64{4}, nn.Dense{Units: 3, Activation: 42}, "Dense: Activation(42), expected one of the nn.Activation constants"},
		{[]int64{}, nn.Softmax, "layer m/activation_0: Activation: softmax over the last axis of shape [-1] would mix the batch's examples"},
		{[]int64{4, 5}, nn.LayerNorm{Axis: 3}, "layer m/layer_norm_0: LayerNorm: Axis 3 for input shape [-1 4 5], expected 1 to 2 or -2 to -1"},
		{[]int64{}, nn.LayerNorm{}, "LayerNorm: input shape [-1], expected at least one axis after the batch"},
		{[]int64{4, -1}, nn.LayerNorm{}, "LayerNorm: input shape [-1 4 -1], expected a known size on axis 2"},
		{[]int64{4, 5}, nn.GlobalAveragePooling2D{}, "layer m/global_average_pooling2d_0: GlobalAveragePooling2D: input shape [-1 4 5], expected [batch, height, width, channels]"},
		{[]int64{4, 5, 6}, nn.GlobalAveragePooling1D{}, "GlobalAveragePooling1D: input shape [-1 4 5 6], expected [batch, steps, features]"},
		{[]int64{6, 3}, nn.PositionEmbedding{SequenceLength: 4},
			"layer m/position_embedding_0: PositionEmbedding: input shape [-1 6 3] has sequences of 6 steps, longer than SequenceLength 4"},
		{[]int64{6}, nn.TokenAndPositionEmbedding{VocabularySize: 9, SequenceLength: 4, EmbeddingDim: 3},
			"layer m/token_and_position_embedding_0: TokenAndPositionEmbedding: input shape [-1 6] has sequences of 6 steps, longer than SequenceLength 4"},
		{[]int64{6}, nn.TokenAndPositionEmbedding{VocabularySize: 9, EmbeddingDim: 3}, "TokenAndPositionEmbedding: SequenceLength 0, expected at least 1"},
		{[]int64{4, 4, 2}, nn.MaxPool2D{Size: 5}, "layer m/max_pool2d_0: MaxPool2D: window 5 with VALID padding does not fit"},
		{[]int64{64}, nn.Reshape{Shape: []int64{7, 7}}, "Reshape: shape [7 7] holds 49 elements, the input [64] holds 64"},
		{[]int64{4}, nn.Dropout{Rate: 1}, "Dropout: Rate 1"},
	}
	for i, c := range cases {
		err := s.Scope(func(sc strategy.Scope) error {
			_, err := nn.NewSequential(sc, "m", c.in, int64(i), c.spec)
			return err
		})
		assert.ErrorContains(t, err, c.want, "case %d", i)
	}

	// Applied to an input of the wrong size, a layer names it at Build.
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = nn.NewSequential(sc, "net", []int64{4}, 1, nn.Dense{Units: 2})
		return err
	}))
	_, err = s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 5}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			y, err := m.Apply(r, in["x"], true)
			return strategy.Outputs{"y": y}, err
		})
	assert.ErrorContains(t, err, "model net: input shape [-1 5], expected [-1 4]")
}
