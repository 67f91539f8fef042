package optimizer_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// mirroredRun trains w [2] under mirrored x2 with the loss sum(w * g),
// each replica fed its own g, so that a step's gradient is the sum of the
// replicas' g.
type mirroredRun struct {
	s    *mirrored.Strategy
	w    strategy.Variable
	step strategy.Step
}

func newMirroredRun(t *testing.T, opt strategy.Optimizer) *mirroredRun {
	t.Helper()
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	init, err := tf.NewTensor([]float32{1, -1})
	require.NoError(t, err)
	run := &mirroredRun{s: s}
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		run.w, err = sc.Variable("w", tf.Float, []int64{2}, strategy.Constant(init))
		return err
	}))
	spec := strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{2}}}
	run.step, err = s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope().SubScope("loss")
		loss := op.Sum(sc, op.Mul(sc.SubScope("mul"), strategy.MustRead(rc, run.w), in["g"]), op.Const(sc.SubScope("axis"), int32(0)))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{run.w})
	})
	require.NoError(t, err)
	return run
}

// run runs one step, replica r fed g[r].
func (run *mirroredRun) run(t *testing.T, g [2][]float32) {
	t.Helper()
	feeds := make([]map[string]*tf.Tensor, 2)
	for r := range feeds {
		x, err := tf.NewTensor(g[r])
		require.NoError(t, err)
		feeds[r] = map[string]*tf.Tensor{"g": x}
	}
	_, err := run.s.RunReplicas(ctx, run.step, feeds, 2)
	require.NoError(t, err)
}

// state returns every replica's copy of every variable (w, the
// optimizers' slots and counts), by name, as float64s.
func (run *mirroredRun) state(t *testing.T) map[string][][]float64 {
	t.Helper()
	out := map[string][][]float64{}
	for _, v := range run.s.Variables() {
		copies, err := run.s.Copies(ctx, v)
		require.NoError(t, err)
		for _, c := range copies {
			var vals []float64
			switch x := c.Value().(type) {
			case int64:
				vals = []float64{float64(x)}
			case float32:
				vals = []float64{float64(x)}
			default:
				for _, f := range tensorutil.Float32s(c) {
					vals = append(vals, float64(f))
				}
			}
			out[v.Name()] = append(out[v.Name()], vals)
		}
	}
	return out
}

func scalarOf(t *testing.T, st map[string][][]float64, name string) float64 {
	t.Helper()
	require.Contains(t, st, name)
	require.Len(t, st[name], 2, "copies of %s", name)
	require.Equal(t, st[name][0], st[name][1], "the replicas' copies of %s differ", name)
	return st[name][0][0]
}

// A step whose gradients overflow is skipped on both replicas of
// mirrored x2 — w, Adam's slots and its step count keep their values —
// and halves the scale; finite steps apply Adam exactly as without loss
// scaling, and after the growth interval of finite steps the scale
// doubles.
func TestLossScaleSkipsOverflowOnEveryReplicaAndGrows(t *testing.T) {
	ls, err := optimizer.NewLossScale(optimizer.NewAdam(optimizer.Constant(0.1)), optimizer.WithGrowthInterval(2))
	require.NoError(t, err)
	run := newMirroredRun(t, ls)
	plain := newMirroredRun(t, optimizer.NewAdam(optimizer.Constant(0.1)))
	finite := [][2][]float32{{{1, -2}, {0.5, 0.25}}, {{-1, 3}, {2, 1}}, {{0.1, 0.2}, {-0.3, 4}}}

	run.run(t, finite[0])
	plain.run(t, finite[0])
	before := run.state(t)
	assert.Equal(t, float64(1<<15), scalarOf(t, before, "LossScale/scale"))
	assert.Equal(t, 1.0, scalarOf(t, before, "LossScale/good_steps"))

	// 1e35 times the scale 2^15 overflows float32 on replica 1 only; the
	// all-reduced gradient is infinite on both.
	run.run(t, [2][]float32{{1, 1}, {1e35, 1}})
	after := run.state(t)
	for _, name := range []string{"w", "w/Adam/m", "w/Adam/v", "Adam/iterations"} {
		assert.Equal(t, before[name], after[name], "%s after the skipped step", name)
	}
	assert.Equal(t, float64(1<<14), scalarOf(t, after, "LossScale/scale"), "the scale backs off by 0.5")
	assert.Equal(t, 0.0, scalarOf(t, after, "LossScale/good_steps"))

	for _, g := range finite[1:] {
		run.run(t, g)
		plain.run(t, g)
	}
	got, want := run.state(t), plain.state(t)
	for _, name := range []string{"w", "w/Adam/m", "w/Adam/v"} {
		for r := range 2 {
			assert.InDeltaSlice(t, want[name][r], got[name][r], 1e-6, "%s on replica %d after 3 applied steps", name, r)
		}
	}
	assert.Equal(t, 3.0, scalarOf(t, got, "Adam/iterations"), "the skipped step does not count")
	assert.Equal(t, float64(1<<15), scalarOf(t, got, "LossScale/scale"), "2 finite steps in a row double the scale")
	assert.Equal(t, 0.0, scalarOf(t, got, "LossScale/good_steps"))
}

// The scale and the count of finite steps are saved in checkpoints and
// restored with the inner optimizer's state.
func TestLossScaleStateIsCheckpointed(t *testing.T) {
	newLS := func() strategy.Optimizer {
		ls, err := optimizer.NewLossScale(optimizer.NewAdam(nil))
		require.NoError(t, err)
		return ls
	}
	run := newMirroredRun(t, newLS())
	for _, g := range [][2][]float32{{{1, 2}, {3, 4}}, {{1e35, 1}, {1, 1}}, {{-1, 2}, {0, 1}}} {
		run.run(t, g)
	}
	saved := run.state(t)
	require.Equal(t, float64(1<<14), scalarOf(t, saved, "LossScale/scale"))
	require.Equal(t, 1.0, scalarOf(t, saved, "LossScale/good_steps"))
	prefix := filepath.Join(t.TempDir(), "ckpt")
	saver, err := checkpoint.NewSaver(run.s)
	require.NoError(t, err)
	require.NoError(t, saver.Save(ctx, prefix, nil))

	fresh := newMirroredRun(t, newLS())
	restorer, err := checkpoint.NewSaver(fresh.s)
	require.NoError(t, err)
	_, err = restorer.Restore(ctx, prefix)
	require.NoError(t, err)
	assert.Equal(t, saved, fresh.state(t))
}

// scalarVariable returns the default strategy with one variable w [1] of
// zeros.
func scalarVariable(t *testing.T) (*onedevice.Strategy, strategy.Variable) {
	t.Helper()
	s, err := onedevice.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var w strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		w, err = sc.Variable("w", tf.Float, []int64{1}, strategy.Zeros())
		return err
	}))
	return s, w
}

// halfStep returns w (initially 0) after one update by opt of the loss
// sum(w·a·b), computed in float16 with a = b = 2^-13: its gradient 2^-26
// underflows float16.
func halfStep(t *testing.T, opt strategy.Optimizer) float64 {
	t.Helper()
	s, w := scalarVariable(t)
	step, err := s.Build(strategy.InputSpec{"a": {DType: tf.Float, Shape: []int64{1}}}, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope().SubScope("loss")
		a := op.Cast(sc.SubScope("a16"), in["a"], tf.Half)
		wa := op.Mul(sc.SubScope("wa"), op.Cast(sc.SubScope("w16"), strategy.MustRead(rc, w), tf.Half), a)
		loss := op.Cast(sc.SubScope("f32"), op.Sum(sc, op.Mul(sc.SubScope("wab"), wa, a), op.Const(sc.SubScope("axis"), int32(0))), tf.Float)
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{w})
	})
	require.NoError(t, err)
	a, err := tf.NewTensor([]float32{float32(math.Ldexp(1, -13))})
	require.NoError(t, err)
	_, err = s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"a": a}}, 1)
	require.NoError(t, err)
	v, err := s.Value(ctx, w)
	require.NoError(t, err)
	return float64(v.Value().([]float32)[0])
}

// Minimize scales the loss by the scale and Apply unscales in float32: a
// gradient that underflows float16 without loss scaling reaches the
// update exactly with it.
func TestLossScaleKeepsFloat16GradientsFromUnderflowing(t *testing.T) {
	assert.Equal(t, 0.0, halfStep(t, optimizer.NewSGD(optimizer.Constant(1))), "without loss scaling the gradient underflows")
	ls, err := optimizer.NewLossScale(optimizer.NewSGD(optimizer.Constant(1)))
	require.NoError(t, err)
	assert.Equal(t, -math.Ldexp(1, -26), halfStep(t, ls), "w - 1·2^-26")
}

// NewLossScale rejects settings that cannot work, naming them.
func TestLossScaleBadOptions(t *testing.T) {
	inner := optimizer.NewSGD(nil)
	for _, c := range []struct {
		opt  optimizer.LossScaleOption
		want string
	}{
		{optimizer.WithInitialScale(0), "initial scale 0"},
		{optimizer.WithInitialScale(math.NaN()), "initial scale NaN"},
		{optimizer.WithInitialScale(math.Inf(1)), "initial scale +Inf"},
		{optimizer.WithInitialScale(1e40), "initial scale 1e+40"},
		{optimizer.WithGrowthInterval(0), "growth interval 0"},
		{optimizer.WithGrowthFactor(0.5), "growth factor 0.5"},
		{optimizer.WithGrowthFactor(math.NaN()), "growth factor NaN"},
		{optimizer.WithBackoffFactor(0), "backoff factor 0"},
		{optimizer.WithBackoffFactor(-1), "backoff factor -1"},
		{optimizer.WithBackoffFactor(2), "backoff factor 2"},
		{optimizer.WithBackoffFactor(math.NaN()), "backoff factor NaN"},
	} {
		_, err := optimizer.NewLossScale(inner, c.opt)
		assert.ErrorContains(t, err, c.want)
	}
	_, err := optimizer.NewLossScale(nil)
	assert.ErrorContains(t, err, "nil inner optimizer")
}

// Gradients of a loss that Minimize did not scale (ApplyGradients) are
// refused at Build rather than divided by the scale.
func TestLossScaleRefusesUnscaledGradients(t *testing.T) {
	ls, err := optimizer.NewLossScale(optimizer.NewSGD(nil))
	require.NoError(t, err)
	s, w := scalarVariable(t)
	_, err = s.Build(strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{1}}}, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		rc := r
		sc := rc.Scope().SubScope("loss")
		loss := op.Sum(sc, op.Mul(sc.SubScope("mul"), strategy.MustRead(rc, w), in["g"]), op.Const(sc.SubScope("axis"), int32(0)))
		grads, err := rc.Gradients(loss, []strategy.Variable{w})
		if err != nil {
			return nil, err
		}
		return nil, rc.ApplyGradients(ls, grads, []strategy.Variable{w})
	})
	assert.ErrorContains(t, err, "gradients of a loss that was not scaled")
}
