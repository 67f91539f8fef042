package mirrored_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/faults"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

func sgdHalf() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }

// trainVoting trains the MLP on n logical CPUs whose gradients rule
// combines, and returns the outcome, the rule's statistics and whether
// every copy of every variable is the same.
func trainVoting(t *testing.T, n int, rule aggregate.Rule, plan testmodel.Plan) (testmodel.Outcome, aggregate.Stats, error) {
	t.Helper()
	s, err := mirrored.New(mirrored.WithLogicalCPUs(n), mirrored.WithAggregation(rule))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	got, err := testmodel.TrainPlan(context.Background(), s, sgdHalf(), plan)
	if err == nil {
		differ, derr := testmodel.DifferingCopies(context.Background(), s)
		require.NoError(t, derr)
		assert.Empty(t, differ, "every copy of every variable is identical")
	}
	return got, s.AggregationStats(), err
}

// attacked is rule under attack a.
func attacked(t *testing.T, a *faults.VoteAttack, rule aggregate.Rule) aggregate.Rule {
	t.Helper()
	r, err := a.Rule(rule)
	require.NoError(t, err)
	return r
}

// With aggregate.Mean the replicas' votes give the sum's model: 4 replicas
// end where the default strategy does.
func TestAggregationMeanMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 30, MicroBatches: []int{32}}
	want, err := testmodel.TrainDefault(context.Background(), sgdHalf(), plan)
	require.NoError(t, err)
	got, stats, err := trainVoting(t, 4, aggregate.Mean(), plan)
	require.NoError(t, err)
	d, at := testmodel.MaxParamDiff(want, got)
	assert.Less(t, d, 1e-5, "%s differs from the default strategy's by %v", at, d)
	assert.Equal(t, aggregate.Stats{Rule: "mean", Steps: 30, Discarded: make([]int64, 4), LastDiscarded: nil}, stats)
}

// One replica whose gradient is flipped and scaled by 100 (a faulty
// device) wrecks the mean; the median of 5 replicas trains on as the
// honest replicas would.
func TestRobustRuleOutvotesAFaultyReplica(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 100, MicroBatches: []int{40}}
	honest, _, err := trainVoting(t, 5, aggregate.Median(), plan)
	require.NoError(t, err)
	attack := &faults.VoteAttack{Worker: 3, Kind: faults.SignFlip, Scale: 100}
	robust, _, err := trainVoting(t, 5, attacked(t, attack, aggregate.Median()), plan)
	require.NoError(t, err)
	mean, _, err := trainVoting(t, 5, attacked(t, attack, aggregate.Mean()), plan)
	if err != nil { // the model diverged until every gradient held NaN or Inf
		require.ErrorContains(t, err, "aggregation mean: [replica 0")
		require.ErrorContains(t, err, "sent a gradient holding NaN or Inf")
	} else {
		assert.True(t, math.IsNaN(mean.FinalLoss) || mean.FinalLoss > 5*honest.FinalLoss,
			"the mean under attack reached loss %v, the honest median %v", mean.FinalLoss, honest.FinalLoss)
	}
	assert.Less(t, robust.FinalLoss, 2*honest.FinalLoss, "the median under attack reached loss %v, without %v", robust.FinalLoss, honest.FinalLoss)
}

// A vote holding NaN fails the step naming its replica under Mean, and is
// discarded, every step, under a robust rule.
func TestNonFiniteReplicaVotes(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 5, MicroBatches: []int{40}, Poisoned: []int{2}}
	_, _, err := trainVoting(t, 5, aggregate.Mean(), plan)
	require.ErrorContains(t, err, "aggregation mean: [replica 2 (/job:localhost/replica:0/task:0/device:CPU:2)] sent a gradient holding NaN or Inf")
	_, stats, err := trainVoting(t, 5, aggregate.Median(), plan)
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 0, 5, 0, 0}, stats.Discarded)
	assert.Equal(t, []int{2}, stats.LastDiscarded)
}

// A rule the number of replicas cannot honour is refused by New, naming
// the rule, f and the count; accumulation is refused at the step.
func TestAggregationRefused(t *testing.T) {
	_, err := mirrored.New(mirrored.WithLogicalCPUs(4), mirrored.WithAggregation(aggregate.Krum(1)))
	require.ErrorContains(t, err, "mirrored: WithAggregation over 4 replicas (one vote each): aggregate: krum(1) needs more than 2f+2 = 4")
	_, _, err = trainVoting(t, 2, aggregate.Median(), testmodel.Plan{Model: "mlp", Steps: 1, MicroBatches: []int{8, 8}})
	require.ErrorContains(t, err, "WithAccumulation(2): the strategy's aggregation rule")
}
