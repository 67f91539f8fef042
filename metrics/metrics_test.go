package metrics_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// evalSet is 97 held-out digits: with a global batch of 6 the last batch
// has 1 example, so that under DATA sharding some replicas score none.
func evalSet(t *testing.T) digits.Data {
	t.Helper()
	data, err := digits.Load()
	require.NoError(t, err)
	_, test := data.Split(97, 7)
	require.Equal(t, 97, test.Len())
	return test
}

// build creates the digits MLP (seed 3, untrained) and an accuracy metric
// in s, and builds the eval step that updates it.
func build(s strategy.Strategy) (strategy.Step, *metrics.Accuracy, error) {
	var m *nn.Sequential
	var acc *metrics.Accuracy
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		if m, err = models.New(sc, "mlp", 16, 3); err != nil {
			return err
		}
		acc, err = metrics.NewAccuracy(sc, "metrics/accuracy")
		return err
	}); err != nil {
		return nil, nil, err
	}
	step, err := s.Build(models.Spec, models.EvalStep(m, acc))
	return step, acc, err
}

// evaluate scores test with Evaluate under s, its batches distributed by
// DATA sharding of global batches of 6, or, with fromFunction, by
// per-worker shards of the examples in per-replica batches of 2 (workers'
// inputs then end at different steps).
func evaluate(ctx context.Context, s strategy.Strategy, test digits.Data, fromFunction bool) (float64, error) {
	step, acc, err := build(s)
	if err != nil {
		return 0, err
	}
	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	if err != nil {
		return 0, err
	}
	var dist *dataset.Distributed
	if fromFunction {
		dist, err = s.DistributeDatasetsFromFunction(func(ic dataset.InputContext) (dataset.Dataset, error) {
			return dataset.Batched(dataset.Shard(ds, ic.NumInputPipelines, ic.InputPipelineID), 2, false), nil
		})
	} else {
		dist, err = s.DistributeDataset(dataset.Batched(ds, 6, false), dataset.WithShardPolicy(dataset.ShardData))
	}
	if err != nil {
		return 0, err
	}
	res, err := metrics.Evaluate(ctx, s, step, dist, acc)
	return res[acc.Name()], err
}

// Under the default strategy, Evaluate gives the share of the eval set the
// model gets right, as one batch of the whole set counts it, and a second
// Evaluate gives it again: the metric is reset, not added to.
func TestEvaluateDefault(t *testing.T) {
	ctx := context.Background()
	test := evalSet(t)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	step, acc, err := build(s)
	require.NoError(t, err)
	x, err := tf.NewTensor(test.X)
	require.NoError(t, err)
	y, err := tf.NewTensor(test.Y)
	require.NoError(t, err)
	whole, err := s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"x": x, "y": y}}, test.Len())
	require.NoError(t, err)
	want := float64(whole["correct"][0].Value().(float32)) / float64(test.Len())
	require.NoError(t, metrics.Reset(ctx, s, acc))

	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	require.NoError(t, err)
	for range 2 {
		dist, err := s.DistributeDataset(dataset.Batched(ds, 6, false))
		require.NoError(t, err)
		res, err := metrics.Evaluate(ctx, s, step, dist, acc)
		require.NoError(t, err)
		assert.Equal(t, want, res["metrics/accuracy"])
	}
}

// Evaluate over 2 and 3 in-process workers gives every worker exactly the
// default strategy's accuracy on the same eval set with the same weights:
// each example counts once, whether the workers split each global batch
// (DATA sharding, replicas with no example in the last batch) or read
// shards of their own that end at different steps.
func TestEvaluateMultiWorkerMatchesDefault(t *testing.T) {
	ctx := context.Background()
	test := evalSet(t)
	s, err := onedevice.New()
	require.NoError(t, err)
	want, err := evaluate(ctx, s, test, false)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.Positive(t, want)
	t.Logf("default strategy: accuracy %v on %d examples", want, test.Len())

	for _, workers := range []int{2, 3} {
		for _, fromFunction := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d workers, from function %v", workers, fromFunction), func(t *testing.T) {
				got := make([]float64, workers)
				errs := onWorkers(t, workers, func(w int, s *multiworker.Strategy) (err error) {
					got[w], err = evaluate(ctx, s, test, fromFunction)
					return err
				})
				for w, err := range errs {
					require.NoError(t, err, "worker %d", w)
					assert.Equal(t, want, got[w], "worker %d", w)
				}
			})
		}
	}
}

// onWorkers runs fn on a multiworker strategy for each of n workers on
// loopback ports, in this process, at once, and returns their errors.
func onWorkers(t *testing.T, n int, fn func(w int, s *multiworker.Strategy) error) []error {
	t.Helper()
	return testcluster.OnWorkers(testcluster.LoopbackSpec(t, n), nil, fn)
}
