package mirrored_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// On 2 devices, 4 micro-steps of 64 examples (32 per replica) train the
// model that the default strategy trains with 1 step of 256, and 64+64+40
// the one of 168; the replicas' copies stay identical. The micro-steps
// that only accumulate run no reduction; the one that applies runs exactly
// one: the gradients and the example count travel in one pack.
func TestAccumulationMatchesDefault(t *testing.T) {
	sgd := func() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }
	for _, micro := range testmodel.AccumulationCases {
		plan := testmodel.Plan{Model: "mlp", Steps: 3, MicroBatches: micro}
		want, err := testmodel.TrainDefault(ctx, sgd(), testmodel.OneStep(plan))
		require.NoError(t, err)

		s, err := mirrored.New(mirrored.WithLogicalCPUs(2),
			mirrored.WithCrossDeviceOps(testmodel.CountingOps{Inner: ingraph.ReductionToOneDevice{}, Counter: "reductions"}))
		require.NoError(t, err)
		defer s.Close()
		var counter strategy.Variable
		require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
			counter, err = testmodel.NewCounter(sc, "reductions")
			return err
		}))
		var counts []int64
		plan.AfterRuns = testmodel.CountAfterRuns(ctx, s, counter, &counts)
		trainMatching(t, s, sgd(), plan, want, micro)
		assert.Equal(t, testmodel.AppliedEvery(len(micro), plan.Steps*len(micro), 1), testmodel.Deltas(counts), "%v: reductions in each run", micro)
	}
}

// A step that accumulates reports its reduced outputs only from the run
// that applies, averaged over every example of the update: the mean loss
// that one step on all of them reports.
func TestAccumulatedReducedOutputs(t *testing.T) {
	one, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer one.Close()
	big, err := testmodel.NewLinear(one, 0.1)
	require.NoError(t, err)
	res, err := big.Run(ctx, 0, 100)
	require.NoError(t, err)
	want := res.Reduced("mean_loss").Value().(float32)

	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer s.Close()
	l, err := testmodel.NewLinear(s, 0.1, strategy.WithAccumulation(3))
	require.NoError(t, err)
	assert.Equal(t, 3, l.Step.Accumulation())
	for i, lo := range []int{0, 40, 80} {
		n := min(40, 100-lo)
		res, err := l.Run(ctx, lo, n)
		require.NoError(t, err)
		assert.Len(t, res["loss"], 2, "run %d: the per-replica losses", i)
		if i < 2 {
			assert.Nil(t, res.Reduced("mean_loss"), "run %d does not apply", i)
			continue
		}
		require.NotNil(t, res.Reduced("mean_loss"))
		assert.InDelta(t, want, res.Reduced("mean_loss").Value().(float32), 1e-6)
	}
}

// A checkpoint saved halfway through an accumulated update holds the
// accumulators and the micro-step count: restored into the same strategy,
// or into the default strategy with one replica, the rest of the update
// gives the weights it gave without the restore.
func TestAccumulationSurvivesCheckpoint(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "ckpt")
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer s.Close()
	l, err := testmodel.NewLinear(s, 0.1, strategy.WithAccumulation(4))
	require.NoError(t, err)
	saver, err := checkpoint.NewSaver(s)
	require.NoError(t, err)
	finish := func(l *testmodel.Linear) []float32 {
		for i, lo := range []int{64, 96} {
			res, err := l.Run(ctx, lo, 32)
			require.NoError(t, err)
			assert.Equal(t, i == 1, res.Reduced("mean_loss") != nil, "run %d of the rest applies: %v", i, i == 1)
		}
		w, err := l.Weights(ctx)
		require.NoError(t, err)
		return w
	}
	for _, lo := range []int{0, 32} {
		_, err := l.Run(ctx, lo, 32)
		require.NoError(t, err)
	}
	require.NoError(t, saver.Save(ctx, prefix, nil))
	want := finish(l)

	_, err = saver.Restore(ctx, prefix)
	require.NoError(t, err)
	assert.InDeltaSlice(t, want, finish(l), 1e-6, "restored into the same strategy")

	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	ld, err := testmodel.NewLinear(def, 0.1, strategy.WithAccumulation(4))
	require.NoError(t, err)
	dsaver, err := checkpoint.NewSaver(def)
	require.NoError(t, err)
	_, err = dsaver.Restore(ctx, prefix)
	require.NoError(t, err)
	assert.InDeltaSlice(t, want, finish(ld), 1e-6, "restored into the default strategy")
}

// trainMatching trains with opt on s as plan says, and checks that the
// model is want to 1e-5 and that the replicas' copies are identical.
func trainMatching(t *testing.T, s *mirrored.Strategy, opt strategy.Optimizer, plan testmodel.Plan, want testmodel.Outcome, label any) {
	t.Helper()
	got, err := testmodel.TrainPlan(ctx, s, opt, plan)
	require.NoError(t, err)
	d, at := testmodel.MaxParamDiff(want, got)
	assert.Less(t, d, 1e-5, "%v: %s differs from the default strategy's by %v", label, at, d)
	differ, err := testmodel.DifferingCopies(ctx, s)
	require.NoError(t, err)
	assert.Empty(t, differ, "%v: the replicas' copies differ", label)
}
