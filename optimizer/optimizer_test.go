package optimizer_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

var ctx = context.Background()

// train runs steps updates of w (initially w0) under opt with the loss
// sum(w * x), so each step's gradient is the fed x; it returns w after each
// step and the optimizer's step count.
func train(t *testing.T, opt strategy.Optimizer, w0 []float32, grads [][]float32) ([][]float32, int64) {
	t.Helper()
	s, err := strategy.Default()
	require.NoError(t, err)
	defer s.Close()
	init, err := tf.NewTensor(w0)
	require.NoError(t, err)
	var w strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) error {
		w, err = sc.Variable("w", tf.Float, []int64{int64(len(w0))}, strategy.Constant(init))
		return err
	}))
	spec := strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{int64(len(w0))}}}
	step, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope().SubScope("loss")
		loss := op.Sum(sc, op.Mul(sc.SubScope("mul"), strategy.MustRead(rc, w), in["g"]), op.Const(sc.SubScope("axis"), int32(0)))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{w})
	})
	require.NoError(t, err)
	var out [][]float32
	for _, g := range grads {
		gt, err := tf.NewTensor(g)
		require.NoError(t, err)
		_, err = s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"g": gt}}, 1)
		require.NoError(t, err)
		v, err := s.Value(ctx, w)
		require.NoError(t, err)
		out = append(out, v.Value().([]float32))
	}
	var iters int64
	for _, v := range s.Variables() {
		if v.Name() == "SGD/iterations" || v.Name() == "Momentum/iterations" || v.Name() == "Adam/iterations" {
			it, err := s.Value(ctx, v)
			require.NoError(t, err)
			iters = it.Value().(int64)
		}
	}
	return out, iters
}

var grads = [][]float32{{1, -2}, {0.5, 0.5}, {-1, 3}}

func TestSGD(t *testing.T) {
	got, iters := train(t, optimizer.NewSGD(optimizer.Constant(0.1)), []float32{1, 1}, grads)
	w := []float64{1, 1}
	for k, g := range grads {
		for i := range w {
			w[i] -= 0.1 * float64(g[i])
			assert.InDelta(t, w[i], got[k][i], 1e-6, "step %d", k)
		}
	}
	assert.Equal(t, int64(3), iters)
}

func TestMomentum(t *testing.T) {
	for _, nesterov := range []bool{false, true} {
		got, _ := train(t, optimizer.NewMomentum(optimizer.Constant(0.1), 0.9, nesterov), []float32{1, 1}, grads)
		w, a := []float64{1, 1}, []float64{0, 0}
		for k, g := range grads {
			for i := range w {
				a[i] = 0.9*a[i] + float64(g[i])
				if nesterov {
					w[i] -= 0.1 * (float64(g[i]) + 0.9*a[i])
				} else {
					w[i] -= 0.1 * a[i]
				}
				assert.InDelta(t, w[i], got[k][i], 1e-6, "nesterov=%v step %d", nesterov, k)
			}
		}
	}
}

func TestAdam(t *testing.T) {
	got, iters := train(t, optimizer.NewAdam(optimizer.Constant(0.01)), []float32{1, 1}, grads)
	const b1, b2, eps, lr = 0.9, 0.999, 1e-7, 0.01
	w, m, v := []float64{1, 1}, []float64{0, 0}, []float64{0, 0}
	for k, g := range grads {
		t1 := float64(k + 1)
		lrT := lr * math.Sqrt(1-math.Pow(b2, t1)) / (1 - math.Pow(b1, t1))
		for i := range w {
			gi := float64(g[i])
			m[i] = b1*m[i] + (1-b1)*gi
			v[i] = b2*v[i] + (1-b2)*gi*gi
			w[i] -= lrT * m[i] / (math.Sqrt(v[i]) + eps)
			assert.InDelta(t, w[i], got[k][i], 1e-5, "step %d", k)
		}
	}
	assert.Equal(t, int64(3), iters)
}
