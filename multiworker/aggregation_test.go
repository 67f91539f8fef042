package multiworker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

func sgd() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }

// trainVoting trains the MLP on n workers of one replica each with rule
// as plan says, and returns each worker's outcome, aggregation statistics
// and error.
func trainVoting(t *testing.T, n int, rule aggregate.Rule, plan testmodel.Plan) ([]testmodel.Outcome, []multiworker.AggregationStats, []error) {
	t.Helper()
	got := make([]testmodel.Outcome, n)
	stats := make([]multiworker.AggregationStats, n)
	opts := []multiworker.Option{multiworker.WithAggregation(rule), multiworker.WithStartupTimeout(30 * time.Second),
		multiworker.WithCollectiveTimeout(30 * time.Second)}
	errs := onWorkers(loopbackSpec(t, n), opts, func(w int, s *multiworker.Strategy) error {
		p := plan
		p.FirstReplica = w
		var err error
		got[w], err = testmodel.TrainPlan(context.Background(), s, sgd(), p)
		stats[w] = s.AggregationStats()
		return err
	})
	return got, stats, errs
}

// With aggregate.Mean the gathered votes give the sum's model: 2 workers
// of 2 replicas end where the default strategy does.
func TestAggregationMeanMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 30, MicroBatches: []int{32}}
	want, err := testmodel.TrainDefault(context.Background(), sgd(), plan)
	require.NoError(t, err)
	got := make([]testmodel.Outcome, 2)
	errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithAggregation(aggregate.Mean())}, twoByTwo...),
		func(w int, s *multiworker.Strategy) error {
			p := plan
			p.FirstReplica = 2 * w
			var err error
			got[w], err = testmodel.TrainPlan(context.Background(), s, sgd(), p)
			assert.EqualValues(t, 30, s.AggregationStats().Steps)
			return err
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	d, at := testmodel.MaxParamDiff(want, got[0])
	assert.Less(t, d, 1e-5, "%s differs from the default strategy's by %v", at, d)
	assert.Equal(t, got[0].Params, got[1].Params)
}

// Every robust rule keeps the 5 workers' variables bit-identical: each
// computes the same aggregate of the same votes.
func TestRobustRulesKeepWorkersIdentical(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 200, MicroBatches: []int{40}}
	for _, rule := range []aggregate.Rule{aggregate.Median(), aggregate.TrimmedMean(1), aggregate.Krum(1),
		aggregate.MultiKrum(1, 3), aggregate.CenteredClip(1, 3)} {
		t.Run(rule.String(), func(t *testing.T) {
			got, stats, errs := trainVoting(t, 5, rule, plan)
			for w := range 5 {
				require.NoError(t, errs[w], "worker %d", w)
				assert.Equal(t, got[0].Params, got[w].Params, "worker %d's variables differ from worker 0's", w)
				assert.Equal(t, stats[0], stats[w])
			}
			assert.EqualValues(t, 200, stats[0].Steps)
		})
	}
}

// A vote holding NaN fails the step naming its worker under Mean, and is
// discarded, every step, under a robust rule.
func TestNonFiniteVotes(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 5, MicroBatches: []int{40}, Poisoned: []int{2}}
	_, _, errs := trainVoting(t, 5, aggregate.Mean(), plan)
	for w, err := range errs {
		require.ErrorContains(t, err, "aggregation mean: [worker:2] sent a gradient holding NaN or Inf", "worker %d", w)
	}
	got, stats, errs := trainVoting(t, 5, aggregate.Median(), plan)
	for w := range errs {
		require.NoError(t, errs[w])
		assert.Equal(t, []int64{0, 0, 5, 0, 0}, stats[w].Discarded)
		assert.Equal(t, []int{2}, stats[w].LastDiscarded)
		assert.Equal(t, got[0].Params, got[w].Params)
	}
}

// A rule the group or the backend cannot honour is refused at start,
// naming the rule, f and the number of workers; so is accumulation.
func TestAggregationRefused(t *testing.T) {
	errs := onWorkers(loopbackSpec(t, 4), []multiworker.Option{multiworker.WithAggregation(aggregate.Krum(1))},
		func(int, *multiworker.Strategy) error { return nil })
	for _, err := range errs {
		require.ErrorContains(t, err, "krum(1)")
		require.ErrorContains(t, err, "got 4")
	}
	errs = onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithAggregation(aggregate.Median()),
		multiworker.WithCommunication(multiworker.Ring)}, func(int, *multiworker.Strategy) error { return nil })
	for _, err := range errs {
		require.ErrorContains(t, err, "WithAggregation(median): only tfdist's collective engine aggregates votes")
	}
	plan := testmodel.Plan{Model: "mlp", Steps: 1, MicroBatches: []int{8, 8}}
	_, _, errs = trainVoting(t, 2, aggregate.Median(), plan)
	for _, err := range errs {
		require.ErrorContains(t, err, fmt.Sprintf("WithAccumulation(%d): the strategy's aggregation rule", 2))
	}
}
