package ingraph_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// countingDefault is the default strategy with its reductions counted (see
// testmodel.CountingOps), and its counter.
func countingDefault(t *testing.T) (*ingraph.Engine, strategy.Variable) {
	t.Helper()
	e, err := ingraph.New(ingraph.Config{Name: "default", Devices: []string{strategy.LocalCPU(0)},
		CrossDeviceOps: testmodel.CountingOps{Inner: ingraph.ReductionToOneDevice{}, Counter: "reductions"}})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	var counter strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) (err error) {
		counter, err = testmodel.NewCounter(sc, "reductions")
		return err
	}))
	return e, counter
}

// Gradient accumulation is exact: 4 micro-steps of 64 examples train the
// model that 1 step of 256 does, and 64+64+40 the one that 168 does — the
// last micro-batch partial, weighted by its examples. The micro-steps
// that only accumulate run no reduction; the one that applies runs one
// per gradient and one for the example count (the default strategy does
// not pack).
func TestAccumulationEqualsOneLargeStep(t *testing.T) {
	sgd := func() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }
	for _, micro := range testmodel.AccumulationCases {
		plan := testmodel.Plan{Model: "mlp", Steps: 3, MicroBatches: micro}
		want, err := testmodel.TrainDefault(ctx, sgd(), testmodel.OneStep(plan))
		require.NoError(t, err)

		e, counter := countingDefault(t)
		var counts []int64
		plan.AfterRuns = testmodel.CountAfterRuns(ctx, e, counter, &counts)
		got, err := testmodel.TrainPlan(ctx, e, sgd(), plan)
		require.NoError(t, err)
		d, at := testmodel.MaxParamDiff(want, got)
		assert.Less(t, d, 1e-5, "%v: %s differs from one step on all examples by %v", micro, at, d)
		assert.Equal(t, testmodel.AppliedEvery(len(micro), plan.Steps*len(micro), int64(len(got.Params)+1)), testmodel.Deltas(counts),
			"%v: reductions in each run", micro)
	}
}

// The same micro-batches without accumulation (one update each) train
// another model: the comparison above can fail.
func TestAccumulationDiffersFromSmallSteps(t *testing.T) {
	sgd := optimizer.NewSGD(optimizer.Constant(0.5))
	large, err := testmodel.TrainDefault(ctx, sgd, testmodel.Plan{Model: "mlp", Steps: 1, MicroBatches: []int{256}})
	require.NoError(t, err)
	small, err := testmodel.TrainDefault(ctx, sgd, testmodel.Plan{Model: "mlp", Steps: 4, MicroBatches: []int{64}})
	require.NoError(t, err)
	d, _ := testmodel.MaxParamDiff(large, small)
	assert.Greater(t, d, 1e-3)
}

// Bad uses of accumulation are build errors naming what is wrong.
func TestAccumulationMisuse(t *testing.T) {
	for _, k := range []int{0, -3} {
		e, err := onedevice.New()
		require.NoError(t, err)
		defer e.Close()
		_, err = testmodel.NewLinear(e, 0.1, strategy.WithAccumulation(k))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "Minimize: WithAccumulation(")
		assert.Contains(t, err.Error(), "expected at least 1")
	}

	e, err := onedevice.New()
	require.NoError(t, err)
	defer e.Close()
	var a, b strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) (err error) {
		if a, err = sc.Variable("a", tf.Float, nil, strategy.Zeros()); err != nil {
			return err
		}
		b, err = sc.Variable("b", tf.Float, nil, strategy.Zeros())
		return err
	}))
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}
	sgd := optimizer.NewSGD(nil)
	loss := func(r strategy.Replica, v strategy.Variable, x tf.Output, name string) tf.Output {
		s := r.Scope().SubScope(name)
		return r.AverageLoss(op.Mul(s, x, strategy.MustRead(r, v)))
	}
	cases := map[string]strategy.ReplicaFn{
		"AllReduce in a step with WithAccumulation(2)": func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sum, err := r.AllReduce(strategy.Sum, in["x"])
			if err != nil {
				return nil, err
			}
			return strategy.Outputs{"sum": sum}, r.Minimize(sgd, loss(r, a, in["x"], "a"), []strategy.Variable{a}, strategy.WithAccumulation(2))
		},
		"WithAccumulation(1) where another Minimize of the step has WithAccumulation(2)": func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			if err := r.Minimize(sgd, loss(r, a, in["x"], "a"), []strategy.Variable{a}, strategy.WithAccumulation(2)); err != nil {
				return nil, err
			}
			return strategy.Outputs{}, r.Minimize(sgd, loss(r, b, in["x"], "b"), []strategy.Variable{b})
		},
		`accumulator "a/accumulation/gradient" is used twice`: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			if err := r.Minimize(sgd, loss(r, a, in["x"], "a"), []strategy.Variable{a}, strategy.WithAccumulation(2)); err != nil {
				return nil, err
			}
			return strategy.Outputs{}, r.Minimize(sgd, loss(r, a, in["x"], "a2"), []strategy.Variable{a}, strategy.WithAccumulation(2))
		},
	}
	for want, fn := range cases {
		_, err := e.Build(spec, fn)
		require.Error(t, err, want)
		assert.Contains(t, err.Error(), want)
	}

	// The steps of a strategy share one accumulation state, so one k.
	_, err = e.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{}, r.Minimize(sgd, loss(r, a, in["x"], "a"), []strategy.Variable{a}, strategy.WithAccumulation(2))
	})
	require.NoError(t, err)
	_, err = e.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{}, r.Minimize(sgd, loss(r, b, in["x"], "b"), []strategy.Variable{b}, strategy.WithAccumulation(3))
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithAccumulation(3): the strategy has a step that accumulates 2 micro-steps")
}
