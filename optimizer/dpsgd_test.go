package optimizer_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// dpRun trains a (n elements, initially 0) on engine e for one update per
// element of steps, each a batch of per-example gradients: example i's
// loss is sum(a * g_i), so its gradient is g_i. Replica r of the engine's
// replicas takes the r-th contiguous share of the batch. It returns a
// after each step.
func dpRun(t *testing.T, e testmodel.Engine, opt strategy.Optimizer, n int, steps [][][]float32) [][]float32 {
	t.Helper()
	var a strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		a, err = sc.Variable("a", tf.Float, []int64{int64(n)}, strategy.Zeros())
		return err
	}))
	spec := strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{-1, int64(n)}}}
	step, err := e.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope().SubScope("loss")
		perExample := op.Sum(s, op.Mul(s.SubScope("mul"), strategy.MustRead(rc, a), in["g"]), op.Const(s.SubScope("axis"), int32(1)))
		return nil, rc.Minimize(opt, perExample, []strategy.Variable{a})
	})
	require.NoError(t, err)
	R := e.NumLocalReplicas()
	var out [][]float32
	for _, batch := range steps {
		feeds := make([]map[string]*tf.Tensor, R)
		per := len(batch) / R
		for r := range R {
			rows := batch[r*per : (r+1)*per]
			if r == R-1 {
				rows = batch[r*per:]
			}
			feeds[r] = map[string]*tf.Tensor{"g": matrix(t, rows, n)}
		}
		_, err := e.RunReplicas(context.Background(), step, feeds, len(batch))
		require.NoError(t, err)
		v, err := e.Value(context.Background(), a)
		require.NoError(t, err)
		out = append(out, v.Value().([]float32))
	}
	return out
}

// matrix returns rows as a [len(rows), n] float32 tensor.
func matrix(t *testing.T, rows [][]float32, n int) *tf.Tensor {
	flat := make([]float32, 0, len(rows)*n)
	for _, r := range rows {
		flat = append(flat, r...)
	}
	x, err := tf.NewTensor(flat)
	require.NoError(t, err)
	require.NoError(t, x.Reshape([]int64{int64(len(rows)), int64(n)}))
	return x
}

func dpsgd(t *testing.T, c optimizer.DPConfig, lr float32) strategy.Optimizer {
	t.Helper()
	opt, err := optimizer.DPSGD(optimizer.NewSGD(optimizer.Constant(lr)), c)
	require.NoError(t, err)
	return opt
}

// randomBatches returns steps batches of size examples of n-element
// gradients, their norms spread around the clip norm 1.
func randomBatches(steps, size, n int) [][][]float32 {
	r := rand.New(rand.NewPCG(3, 4))
	out := make([][][]float32, steps)
	for k := range out {
		for range size {
			g := make([]float32, n)
			scale := r.Float64() * 2 / math.Sqrt(float64(n))
			for j := range g {
				g[j] = float32(r.NormFloat64() * scale)
			}
			out[k] = append(out[k], g)
		}
	}
	return out
}

// Without noise, an update is the sum of each example's gradient clipped
// to the clip norm (alone, over the whole variable), divided by the
// expected batch: the brute-force sum, one example at a time, to 1e-5.
func TestDPSGDClipsEachExample(t *testing.T) {
	const n, lr, expected = 5, 0.5, 10.0
	batches := randomBatches(4, 7, n)
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	got := dpRun(t, def, dpsgd(t, optimizer.DPConfig{ClipNorm: 1, ExpectedBatch: expected, MaxExamples: 9}, lr), n, batches)
	want := make([]float64, n)
	for k, batch := range batches {
		for _, g := range batch {
			var sq float64
			for _, x := range g {
				sq += float64(x) * float64(x)
			}
			f := math.Min(1, 1/math.Sqrt(sq))
			for j, x := range g {
				want[j] -= lr * float64(x) * f / expected
			}
		}
		for j := range want {
			assert.InDelta(t, want[j], got[k][j], 1e-5, "step %d, element %d", k, j)
		}
	}
}

// stats returns the mean and standard deviation of xs.
func stats(xs []float64) (mean, std float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		std += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(std / float64(len(xs)))
}

// The noise added to a step is N(0, (σC)²) per element, once per global
// step (divided, like the sum, by the expected batch): with zero gradients
// over 20,000 elements its mean is 0 and its standard deviation σC, each
// within 6 standard errors (fixed seeds). Each step draws anew; the same
// seed draws the same noise, another seed other noise.
func TestDPSGDNoise(t *testing.T) {
	const n, sigma, clip, expected = 20000, 2.0, 0.5, 4.0
	zeros := [][][]float32{make([][]float32, 3), make([][]float32, 3)}
	for k := range zeros {
		for i := range zeros[k] {
			zeros[k][i] = make([]float32, n)
		}
	}
	run := func(seed int64) [][]float32 {
		def, err := onedevice.New()
		require.NoError(t, err)
		defer def.Close()
		cfg := optimizer.DPConfig{ClipNorm: clip, NoiseMultiplier: sigma, ExpectedBatch: expected, MaxExamples: 3, Seed: seed}
		return dpRun(t, def, dpsgd(t, cfg, 1), n, zeros)
	}
	got := run(7)
	var first, second []float64
	for j := range n {
		first = append(first, -float64(got[0][j])*expected)
		second = append(second, -float64(got[1][j]-got[0][j])*expected)
	}
	for i, noise := range [][]float64{first, second} {
		mean, std := stats(noise)
		assert.InDelta(t, 0, mean, 6*sigma*clip/math.Sqrt(n), "step %d: mean", i)
		assert.InDelta(t, sigma*clip, std, 6*sigma*clip/math.Sqrt(2*n), "step %d: standard deviation", i)
	}
	var corr float64
	for j := range n {
		corr += first[j] * second[j]
	}
	assert.Less(t, math.Abs(corr/n/(sigma*clip*sigma*clip)), 6/math.Sqrt(n), "two steps draw independent noise")
	assert.Equal(t, got, run(7), "the same seed")
	assert.NotEqual(t, got[0][:10], run(8)[0][:10], "another seed")
}

// With noise and without, Mirrored on 2 and 4 replicas updates as the
// default strategy on the same global batches (uneven ones included),
// with the same seed: the clipped sums are summed across replicas and the
// noise is added once.
func TestDPSGDMirroredMatchesDefault(t *testing.T) {
	const n = 6
	batches := randomBatches(5, 8, n)
	batches = append(batches, randomBatches(1, 7, n)...)
	for _, sigma := range []float32{0, 1.5} {
		cfg := optimizer.DPConfig{ClipNorm: 1, NoiseMultiplier: sigma, ExpectedBatch: 8, MaxExamples: 8, Seed: 11}
		def, err := onedevice.New()
		require.NoError(t, err)
		want := dpRun(t, def, dpsgd(t, cfg, 0.3), n, batches)
		def.Close()
		for _, replicas := range []int{2, 4} {
			m, err := mirrored.New(mirrored.WithLogicalCPUs(replicas))
			require.NoError(t, err)
			got := dpRun(t, m, dpsgd(t, cfg, 0.3), n, batches)
			m.Close()
			for k := range want {
				for j := range want[k] {
					assert.InDelta(t, want[k][j], got[k][j], 1e-6, "σ %v, %d replicas, step %d", sigma, replicas, k)
				}
			}
		}
	}
}

// Bad settings are errors naming the value and the range expected.
func TestDPSGDBadInput(t *testing.T) {
	sgd := optimizer.NewSGD(nil)
	ok := optimizer.DPConfig{ClipNorm: 1, NoiseMultiplier: 1, ExpectedBatch: 10, MaxExamples: 4}
	for _, c := range []struct {
		edit func(*optimizer.DPConfig)
		want string
	}{
		{func(c *optimizer.DPConfig) { c.ClipNorm = 0 }, "clip norm 0: expected a positive finite number"},
		{func(c *optimizer.DPConfig) { c.NoiseMultiplier = -1 }, "noise multiplier -1: expected a finite number >= 0"},
		{func(c *optimizer.DPConfig) { c.ExpectedBatch = 0 }, "expected batch 0: expected a positive finite number of examples"},
		{func(c *optimizer.DPConfig) { c.MaxExamples = 0 }, "at most 0 examples per replica: expected at least 1"},
	} {
		cfg := ok
		c.edit(&cfg)
		_, err := optimizer.DPSGD(sgd, cfg)
		assert.ErrorContains(t, err, c.want)
	}
	_, err := optimizer.DPSGD(nil, ok)
	assert.ErrorContains(t, err, "nil inner optimizer")
	ls, err := optimizer.NewLossScale(sgd)
	require.NoError(t, err)
	_, err = optimizer.DPSGD(ls, ok)
	assert.ErrorContains(t, err, "scales the loss")
}

// A batch with more examples than MaxExamples fails its step, saying so;
// a loss that is not one value per example, and accumulation, fail the
// build.
func TestDPSGDRefusesWhatItCannotHonour(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	opt := dpsgd(t, optimizer.DPConfig{ClipNorm: 1, ExpectedBatch: 4, MaxExamples: 3}, 0.1)
	var a strategy.Variable
	require.NoError(t, def.Scope(func(sc strategy.Scope) error {
		a, err = sc.Variable("a", tf.Float, []int64{2}, strategy.Zeros())
		return err
	}))
	spec := strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{-1, 2}}}
	build := func(scalar bool, opts ...strategy.MinimizeOption) (strategy.Step, error) {
		return def.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			s := rc.Scope().SubScope("loss")
			loss := op.Sum(s, op.Mul(s.SubScope("mul"), strategy.MustRead(rc, a), in["g"]), op.Const(s.SubScope("axis"), int32(1)))
			if scalar {
				loss = op.Sum(s.SubScope("total"), loss, op.Const(s.SubScope("all"), int32(0)))
			}
			return nil, rc.Minimize(opt, loss, []strategy.Variable{a}, opts...)
		})
	}
	_, err = build(true)
	assert.ErrorContains(t, err, "expected one value per example of the replica's batch, shape [batch]")
	_, err = build(false, strategy.WithAccumulation(2))
	assert.ErrorContains(t, err, "accumulation is not supported with DP-SGD")
	step, err := build(false)
	require.NoError(t, err)
	_, err = def.RunReplicas(context.Background(), step, []map[string]*tf.Tensor{{"g": matrix(t, randomBatches(1, 5, 2)[0], 2)}}, 5)
	assert.ErrorContains(t, err, "a batch of this replica holds more examples than the optimizer allows (MaxExamples 3)")
}
