package multiworker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// twoByTwo are the options of 2 workers of 2 replicas each.
var twoByTwo = []multiworker.Option{multiworker.WithLogicalCPUs(2),
	multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}

// trainOnTwoWorkers trains the MLP with opt on 2 workers of 2 replicas
// each as plan says, checks that all copies of the variables are
// identical, and returns each worker's outcome and the all-reduces each
// worker had started after Build and after every run.
func trainOnTwoWorkers(t *testing.T, opt func() strategy.Optimizer, plan testmodel.Plan) ([]testmodel.Outcome, [][]int64) {
	t.Helper()
	ctx := context.Background()
	got := make([]testmodel.Outcome, 2)
	counts := make([][]int64, 2)
	errs := onWorkers(loopbackSpec(t, 2), twoByTwo, func(w int, s *multiworker.Strategy) error {
		p := plan
		p.FirstReplica = 2 * w
		p.AfterRuns = func(int) error {
			counts[w] = append(counts[w], s.CollectiveStats().AllReduces)
			return nil
		}
		var err error
		if got[w], err = testmodel.TrainPlan(ctx, s, opt(), p); err != nil {
			return err
		}
		differ, err := testmodel.DifferingCopies(ctx, s)
		assert.Empty(t, differ, "worker %d: the replicas' copies differ", w)
		return err
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, got[0].Params, got[1].Params, "both workers hold identical variables")
	return got, counts
}

// On 2 workers of 2 replicas, 4 micro-steps of 64 examples train the model
// that the default strategy trains with 1 step of 256, and 64+64+40 the
// one of 168. The micro-steps that only accumulate run no collective; the
// one that applies runs exactly one all-reduce: the gradients and the
// example count travel in one pack.
func TestAccumulationMatchesDefault(t *testing.T) {
	sgd := func() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }
	for _, micro := range testmodel.AccumulationCases {
		plan := testmodel.Plan{Model: "mlp", Steps: 3, MicroBatches: micro}
		want, err := testmodel.TrainDefault(context.Background(), sgd(), testmodel.OneStep(plan))
		require.NoError(t, err)
		got, counts := trainOnTwoWorkers(t, sgd, plan)
		for w := range 2 {
			d, at := testmodel.MaxParamDiff(want, got[w])
			assert.Less(t, d, 1e-5, "%v: worker %d: %s differs from one step on all examples by %v", micro, w, at, d)
			assert.Equal(t, testmodel.AppliedEvery(len(micro), plan.Steps*len(micro), 1), testmodel.Deltas(counts[w]),
				"%v: worker %d: all-reduces in each run", micro, w)
		}
	}
}
