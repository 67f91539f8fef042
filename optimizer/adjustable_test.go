package optimizer_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// sgdStep is w - lr*g in float32, as ResourceApplyGradientDescent.
func sgdStep(w []float32, lr float32, g []float32) []float32 {
	out := make([]float32, len(w))
	for i := range w {
		out[i] = w[i] - float32(lr*g[i])
	}
	return out
}

// The rate an Adjustable is set to is the rate of every later step, under
// the default strategy and under parameter servers (where the variable is
// on a ps task and the step runs on a worker); it is checkpointed, so a
// fresh strategy restored from a checkpoint taken after a Set trains at
// the rate set, not at the initial one.
func TestAdjustableRateIsReadEveryStepAndCheckpointed(t *testing.T) {
	runs := map[string]func(*testing.T, strategy.Optimizer, []variable) *run{"default": newDefaultRun, "paramserver": newPSRun}
	g := []float32{1, -2}
	for name, newRun := range runs {
		t.Run(name, func(t *testing.T) {
			lr := optimizer.NewAdjustable(0.1)
			r := newRun(t, optimizer.NewSGD(lr), []variable{{"w", []float32{1, 1}}})
			got, err := lr.Value(ctx, r.s.State())
			require.NoError(t, err)
			assert.Equal(t, float32(0.1), got)

			w := []float32{1, 1}
			for _, rate := range []float32{0.1, 0.25, 0, 0.5} {
				if rate != 0.1 {
					require.NoError(t, lr.Set(ctx, r.s.State(), rate))
				}
				got, err := lr.Value(ctx, r.s.State())
				require.NoError(t, err)
				require.Equal(t, rate, got)
				r.step(t, [][]float32{g})
				w = sgdStep(w, rate, g)
				assert.Equal(t, w, r.values(t)[0], "a step at rate %v", rate)
			}

			require.NoError(t, lr.Set(ctx, r.s.State(), 0.125))
			prefix := filepath.Join(t.TempDir(), "ckpt")
			sa, err := checkpoint.NewSaver(r.s)
			require.NoError(t, err)
			require.NoError(t, sa.Save(ctx, prefix, nil))
			entries, err := checkpoint.List(prefix)
			require.NoError(t, err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name)
			}
			assert.Contains(t, names, "SGD/learning_rate")

			fresh := optimizer.NewAdjustable(0.1)
			b := newRun(t, optimizer.NewSGD(fresh), []variable{{"w", []float32{1, 1}}})
			sb, err := checkpoint.NewSaver(b.s)
			require.NoError(t, err)
			_, err = sb.Restore(ctx, prefix)
			require.NoError(t, err)
			got, err = fresh.Value(ctx, b.s.State())
			require.NoError(t, err)
			assert.Equal(t, float32(0.125), got, "the restored rate")
			b.step(t, [][]float32{g})
			assert.Equal(t, sgdStep(w, 0.125, g), b.values(t)[0], "the first step after the restore is at the restored rate")
		})
	}
}

// Under mirrored x2 Set writes every replica's copy of the rate, and both
// replicas step at it.
func TestAdjustableSetsEveryReplica(t *testing.T) {
	lr := optimizer.NewAdjustable(0.1)
	run := newMirroredRun(t, optimizer.NewSGD(lr))
	require.NoError(t, lr.Set(ctx, run.s.State(), 0.5))
	run.run(t, [2][]float32{{1, 2}, {3, -4}})
	st := run.state(t)
	assert.Equal(t, 0.5, scalarOf(t, st, "SGD/learning_rate"))
	require.Len(t, st["w"], 2)
	for r, w := range st["w"] {
		assert.Equal(t, []float64{1 - 0.5*4, -1 - 0.5*-2}, w, "replica %d", r)
	}
}

// Before a step that applies the optimizer is built, Value is and Set
// sets the rate the variable starts at.
func TestAdjustableBeforeItsVariableExists(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	lr := optimizer.NewAdjustable(0.1)
	got, err := lr.Value(ctx, s.State())
	require.NoError(t, err)
	assert.Equal(t, float32(0.1), got)
	require.NoError(t, lr.Set(ctx, s.State(), 0.5))

	r := newDefaultRun(t, optimizer.NewSGD(lr), []variable{{"w", []float32{1, 1}}})
	got, err = lr.Value(ctx, r.s.State())
	require.NoError(t, err)
	assert.Equal(t, float32(0.5), got)
	r.step(t, [][]float32{{1, 1}})
	assert.Equal(t, []float32{0.5, 0.5}, r.values(t)[0])
}

// AdjustableOf finds the Adjustable rate through the wrappers of this
// package, and names the schedule of an optimizer whose rate cannot be
// set; an Adjustable is refused where it cannot be a variable, and a rate
// set out of range is an error naming it.
func TestAdjustableErrors(t *testing.T) {
	lr := optimizer.NewAdjustable(0.1)
	ls, err := optimizer.NewLossScale(optimizer.NewAdam(lr))
	require.NoError(t, err)
	clipped, err := optimizer.ClipByGlobalNorm(ls.Inner(), 1)
	require.NoError(t, err)
	for _, opt := range []strategy.Optimizer{optimizer.NewAdam(lr), ls, clipped} {
		got, err := optimizer.AdjustableOf(opt)
		require.NoError(t, err)
		assert.Same(t, lr, got)
	}
	_, err = optimizer.AdjustableOf(optimizer.NewSGD(optimizer.Constant(0.01)))
	assert.ErrorContains(t, err, "*optimizer.SGD's learning rate is the constant optimizer.Constant(0.01), which the program cannot set: expected an optimizer.NewAdjustable(rate)")
	_, err = optimizer.AdjustableOf(optimizer.NewAdam(optimizer.ExponentialDecay{Initial: 0.1, DecaySteps: 10, Rate: 0.5}))
	assert.ErrorContains(t, err, "the schedule optimizer.ExponentialDecay{Initial:0.1 DecaySteps:10 Rate:0.5 Staircase:false}, which the program cannot set")

	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	for _, bad := range []float32{-1, float32(math.NaN()), float32(math.Inf(1))} {
		assert.ErrorContains(t, lr.Set(ctx, s.State(), bad), "want a finite value >= 0")
	}

	build := func(opt strategy.Optimizer, names ...string) error {
		var ws []strategy.Variable
		var spec strategy.InputSpec
		require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
			var vars []variable
			for _, n := range names {
				vars = append(vars, variable{n, []float32{1}})
			}
			ws, spec, err = createVars(sc, vars)
			return err
		}))
		_, err := s.Build(spec, linearLoss(opt, ws))
		return err
	}
	err = build(optimizer.NewSGD(optimizer.Warmup{Steps: 2, Then: optimizer.NewAdjustable(0.1)}), "in_warmup")
	assert.ErrorContains(t, err, "Warmup.Then is an Adjustable rate, a variable only an optimizer builds")

	wrapped := struct{ optimizer.Schedule }{optimizer.NewAdjustable(0.1)}
	err = build(optimizer.NewSGD(wrapped), "wrapped")
	assert.ErrorContains(t, err, "give it to the optimizer itself, not inside another schedule")

	shared := optimizer.NewAdjustable(0.1)
	require.NoError(t, build(optimizer.NewSGD(shared), "first"))
	err = build(optimizer.NewAdam(shared), "second")
	assert.ErrorContains(t, err, `Adam: the Adjustable learning rate is the variable "SGD/learning_rate" of another optimizer`)
}
