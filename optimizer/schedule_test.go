package optimizer_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/optimizer"
)

var nan = float32(math.NaN())

// Schedules evaluated in the graph agree with their formulas.
func TestSchedules(t *testing.T) {
	cases := []struct {
		sched optimizer.Schedule
		want  func(step int64) float64
	}{
		{optimizer.Constant(0.5), func(int64) float64 { return 0.5 }},
		{optimizer.ExponentialDecay{Initial: 1, DecaySteps: 4, Rate: 0.5}, func(s int64) float64 { return math.Pow(0.5, float64(s)/4) }},
		{optimizer.ExponentialDecay{Initial: 1, DecaySteps: 4, Rate: 0.5, Staircase: true}, func(s int64) float64 { return math.Pow(0.5, float64(s/4)) }},
		{optimizer.PiecewiseConstant{Boundaries: []int64{3, 6}, Values: []float32{1, 0.5, 0.1}}, func(s int64) float64 {
			switch {
			case s < 3:
				return 1
			case s < 6:
				return 0.5
			}
			return 0.1
		}},
		{optimizer.CosineDecay{Initial: 1, DecaySteps: 8, Alpha: 0.1}, func(s int64) float64 {
			f := math.Min(float64(s)/8, 1)
			return 0.9*0.5*(1+math.Cos(math.Pi*f)) + 0.1
		}},
		{optimizer.PolynomialDecay{Initial: 1, DecaySteps: 4, End: 0.1, Power: 2}, func(s int64) float64 {
			return 0.9*math.Pow(1-math.Min(float64(s), 4)/4, 2) + 0.1
		}},
		{optimizer.PolynomialDecay{Initial: 1, DecaySteps: 4, End: 0.1, Cycle: true}, func(s int64) float64 {
			span := 4 * math.Max(1, math.Ceil(float64(s)/4))
			return 0.9*(1-float64(s)/span) + 0.1
		}},
		// Linear from Initial to Then's first rate, then Then offset by
		// the warmup.
		{optimizer.Warmup{Steps: 4, Initial: 0.1, Then: optimizer.PolynomialDecay{Initial: 1, DecaySteps: 5}}, func(s int64) float64 {
			if s < 4 {
				return 0.9*float64(s)/4 + 0.1
			}
			return 1 - math.Min(float64(s-4), 5)/5
		}},
		{optimizer.Warmup{Steps: 2, Then: optimizer.Constant(0.5)}, func(s int64) float64 { return 0.5 * math.Min(float64(s)/2, 1) }},
		{optimizer.Warmup{Steps: 0, Then: optimizer.Constant(0.5)}, func(s int64) float64 { return 0.5 }},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%d_%T", i, c.sched), func(t *testing.T) {
			for k, got := range scheduleValues(t, c.sched, 11) {
				assert.InDelta(t, c.want(int64(k)), float64(got), 1e-6, "step %d", k)
			}
		})
	}
}

// A warmup longer than the run it belongs to is refused where the run's
// length is known.
func TestCheckSteps(t *testing.T) {
	decay := optimizer.CosineDecay{Initial: 0.1, DecaySteps: 900}
	require.NoError(t, optimizer.CheckSteps(optimizer.Warmup{Steps: 100, Then: decay}, 1000))
	require.NoError(t, optimizer.CheckSteps(decay, 1000))
	err := optimizer.CheckSteps(optimizer.Warmup{Steps: 1200, Then: decay}, 1000)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Warmup.Steps is 1200, longer than the 1000 steps of the run")
	err = optimizer.CheckSteps(optimizer.Warmup{Steps: 10, Then: optimizer.Warmup{Steps: 2000, Then: decay}}, 1000)
	require.Error(t, err, "a warmup inside a warmup")
	err = optimizer.CheckSteps(decay, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "total steps is 0, want >= 1")
	err = optimizer.CheckSteps(optimizer.Warmup{Steps: 10, Then: optimizer.CosineDecay{Initial: -1, DecaySteps: 5}}, 100)
	require.Error(t, err, "the schedule itself is validated")
}

// The linear scaling rule: the rate grows with the global batch, which a
// synchronous strategy's replicas make up.
func TestScaleLR(t *testing.T) {
	lr, err := optimizer.ScaleLR(0.1, 256, 8192)
	require.NoError(t, err)
	assert.InDelta(t, 3.2, lr, 1e-6)
	lr, err = optimizer.ScaleLR(0.1, 256, 64)
	require.NoError(t, err)
	assert.InDelta(t, 0.025, lr, 1e-9)

	m, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer m.Close()
	lr, err = optimizer.ScaleLRToReplicas(0.1, 32, 64, m)
	require.NoError(t, err)
	assert.InDelta(t, 0.4, lr, 1e-7, "2 replicas of 64 examples: a global batch of 128")

	for _, bad := range []struct {
		lr                float32
		baseBatch, global int
		want              string
	}{
		{nan, 256, 512, "base learning rate is NaN"},
		{-0.1, 256, 512, "base learning rate is -0.1"},
		{0.1, 0, 512, "base batch size is 0, want >= 1"},
		{0.1, 256, -1, "global batch size is -1, want >= 1"},
	} {
		_, err := optimizer.ScaleLR(bad.lr, bad.baseBatch, bad.global)
		require.Error(t, err)
		assert.Contains(t, err.Error(), bad.want)
	}
	_, err = optimizer.ScaleLRToReplicas(0.1, 32, 0, m)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "per-replica batch size is 0")
}

// scheduleValues evaluates sched in a graph at steps 0..n-1.
func scheduleValues(t *testing.T, sched optimizer.Schedule, n int) []float32 {
	t.Helper()
	s := op.NewScope()
	step := op.Placeholder(s.SubScope("step"), tf.Int64, op.PlaceholderShape(tf.ScalarShape()))
	lr := sched.Build(s.SubScope("lr"), step)
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	out := make([]float32, n)
	for k := range out {
		st, err := tf.NewTensor(int64(k))
		require.NoError(t, err)
		res, err := sess.Run(map[tf.Output]*tf.Tensor{step: st}, []tf.Output{lr}, nil)
		require.NoError(t, err)
		out[k] = res[0].Value().(float32)
	}
	return out
}
