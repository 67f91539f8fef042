package nn_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// trainBatchNorm trains two blocks of a dense layer and a BatchNorm,
// synchronized or not, and a classifier for 5 SGD steps on global
// batches of 16, split evenly among e's replicas, and reads every
// variable.
func trainBatchNorm(t *testing.T, e testmodel.Engine, sync bool) []strategy.VariableValue {
	t.Helper()
	ctx := context.Background()
	var m *nn.Sequential
	require.NoError(t, e.Scope(func(sc strategy.Scope) (err error) {
		m, err = nn.NewSequential(sc, "bn", []int64{3}, 1, nn.Dense{Units: 4, Activation: nn.Tanh},
			nn.BatchNorm{Momentum: 0.9, Synchronized: sync}, nn.Dense{Units: 4, Activation: nn.Tanh},
			nn.BatchNorm{Momentum: 0.9, Synchronized: sync}, nn.Dense{Units: 2})
		return err
	}))
	opt := optimizer.NewSGD(optimizer.Constant(0.1))
	step, err := e.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 3}}, "y": {DType: tf.Int32, Shape: []int64{-1}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"], true)
			if err != nil {
				return nil, err
			}
			loss := r.AverageLoss(nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("loss"), logits, in["y"], 2))
			return nil, r.Minimize(opt, loss, m.Vars())
		})
	require.NoError(t, err)
	const gb = 16
	n := e.NumLocalReplicas()
	for k := range 5 {
		feeds := make([]map[string]*tf.Tensor, n)
		for r := range n {
			var xs [][]float32
			var ys []int32
			for i := r * gb / n; i < (r+1)*gb/n; i++ {
				xs = append(xs, []float32{float32((i*7+k*3)%11) - 5, float32(i*i%13) * 0.5, float32(k+1) * float32(i%5)})
				ys = append(ys, int32((i+k)%2))
			}
			x, err := tf.NewTensor(xs)
			require.NoError(t, err)
			y, err := tf.NewTensor(ys)
			require.NoError(t, err)
			feeds[r] = map[string]*tf.Tensor{"x": x, "y": y}
		}
		_, err := e.RunReplicas(ctx, step, feeds, gb)
		require.NoError(t, err)
	}
	vals, err := strategy.ReadVariables(ctx, e, m.Variables())
	require.NoError(t, err)
	return vals
}

// Synchronized BatchNorms train on 2 and 4 replicas as unsynchronized
// ones on one device: the gradient passes back through their all-reduces
// of the statistics, so every element of every variable, the moving
// statistics included,
// ends within 1e-4 of the one-device run's, at its variable's scale.
func TestSynchronizedBatchNormTrainsAsOneDevice(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want := trainBatchNorm(t, def, false)
	// On one replica the all-reduce is the identity: its gradient too.
	one, err := onedevice.New()
	require.NoError(t, err)
	defer one.Close()
	diff, name, i := strategy.MaxDiff(want, trainBatchNorm(t, one, true))
	assert.Zero(t, diff, "one device, synchronized: %s[%d]", name, i)
	for _, n := range []int{2, 4} {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(n))
		require.NoError(t, err)
		diff, name, i := strategy.MaxDiff(want, trainBatchNorm(t, s, true))
		assert.Less(t, diff, 1e-4, "%d replicas: %s[%d]", n, name, i)
		require.NoError(t, s.Close())
	}
}
