package multiworker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// With WithDeterministic(8), 2 workers of 1 and of 2 devices train the
// one-device strategy's model with 8 virtual shards bit for bit: every
// element of every variable is equal, on both workers.
func TestDeterministicWorkersMatchOneDevice(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 20, MicroBatches: []int{32}}
	def, err := onedevice.New(onedevice.WithDeterministic(8))
	require.NoError(t, err)
	defer def.Close()
	want, err := testmodel.TrainPlan(context.Background(), def, sgd(), plan)
	require.NoError(t, err)
	for _, devices := range []int{1, 2} {
		got := make([]testmodel.Outcome, 2)
		errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(devices), multiworker.WithDeterministic(8)},
			func(w int, s *multiworker.Strategy) error {
				p := plan
				p.FirstReplica = 4 * w // each worker runs 4 of the 8 virtual shards
				var err error
				got[w], err = testmodel.TrainPlan(context.Background(), s, sgd(), p)
				return err
			})
		for w := range 2 {
			require.NoError(t, errs[w])
			d, at := testmodel.MaxVarDiff(want, got[w])
			assert.Zero(t, d, "2×%d, worker %d: largest difference at %s", devices, w, at)
		}
	}
}

// WithDeterministic refuses, naming the value and what would work, the
// options whose sums cannot follow its tree, and replicas that do not
// divide the virtual shards.
func TestDeterministicRefusesOnWorkers(t *testing.T) {
	for _, c := range []struct {
		opts []multiworker.Option
		want string
	}{
		{[]multiworker.Option{multiworker.WithDeterministic(4), multiworker.WithCommunication(multiworker.Ring)},
			"WithDeterministic(4) with WithCommunication(ring): only tfdist's engine sums in tree order"},
		{[]multiworker.Option{multiworker.WithDeterministic(4), multiworker.WithCompression(multiworker.FP16)}, "WithDeterministic(4) with WithCompression(fp16)"},
		{[]multiworker.Option{multiworker.WithDeterministic(4), multiworker.WithAggregation(aggregate.Median())}, "WithDeterministic(4) with WithAggregation(median)"},
		{[]multiworker.Option{multiworker.WithDeterministic(4), multiworker.WithLogicalCPUs(4)}, "deterministic with 4 virtual shards: 8 replicas in sync do not divide them"},
		{[]multiworker.Option{multiworker.WithDeterministic(12)}, "deterministic with 12 virtual shards: expected a power of two"},
	} {
		errs := onWorkers(loopbackSpec(t, 2), c.opts, func(int, *multiworker.Strategy) error { return nil })
		for _, err := range errs {
			require.ErrorContains(t, err, c.want)
		}
	}
}

// Deterministic workers whose kernels may round otherwise, here with
// other intra-op thread counts, are refused on every worker at New,
// naming the field, each worker's value and what would make them agree,
// rather than training another model than one device does.
func TestDeterministicRefusesWorkersThatComputeOtherwise(t *testing.T) {
	threads := []int{1, 2}
	errs := testcluster.OnWorkersWith(loopbackSpec(t, 2), func(w int) []multiworker.Option {
		return []multiworker.Option{multiworker.WithDeterministic(2), multiworker.WithThreads(threads[w], 2)}
	}, func(int, *multiworker.Strategy) error { return nil })
	for w, err := range errs {
		require.ErrorContains(t, err, "deterministic with 2 virtual shards: intra-op threads: ", "worker %d", w)
		assert.ErrorContains(t, err, fmt.Sprintf("task worker:%d has %d and task worker:%d has %d", w, threads[w], 1-w, threads[1-w]))
		assert.ErrorContains(t, err, "TF_NUM_INTRAOP_THREADS")
	}
}

// With WithDeterministic, DistributeDatasetsFromFunction calls its function
// once per virtual shard, with the shard as the input pipeline, so that a
// function that shards by its InputContext trains the same model bit for
// bit in one process and on 2 workers of 1 or 2 devices, a partial last
// step included.
func TestDeterministicDatasetsFromFunction(t *testing.T) {
	want, err := func() (string, error) {
		s, err := onedevice.New(onedevice.WithDeterministic(4))
		if err != nil {
			return "", err
		}
		defer s.Close()
		return trainFromFunction(s)
	}()
	require.NoError(t, err)
	for _, devices := range []int{1, 2} {
		got := make([]string, 2)
		errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(devices), multiworker.WithDeterministic(4)},
			func(w int, s *multiworker.Strategy) (err error) {
				got[w], err = trainFromFunction(s)
				return err
			})
		for w := range 2 {
			require.NoError(t, errs[w])
			assert.Equal(t, want, got[w], "2×%d, worker %d: the hash of every variable", devices, w)
		}
	}
}

// trainFromFunction trains the MLP with Adam on one pass of 5 global
// batches of 64 digits and 13 more, from DistributeDatasetsFromFunction
// with a function that shards by its InputContext, and returns the hash of
// every float variable.
func trainFromFunction(s strategy.Strategy) (string, error) {
	const gb, examples = 64, 5*64 + 13
	ctx := context.Background()
	d, err := digits.Load()
	if err != nil {
		return "", err
	}
	dist, err := s.DistributeDatasetsFromFunction(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		per, err := ictx.PerReplicaBatchSize(gb)
		if err != nil {
			return nil, err
		}
		ds, err := dataset.FromSlices(map[string]any{"x": d.X[:examples], "y": d.Y[:examples]})
		return dataset.Batched(dataset.Shard(ds, ictx.NumInputPipelines, ictx.InputPipelineID), per, false), err
	}, dataset.WithGlobalBatchSize(gb))
	if err != nil {
		return "", err
	}
	var m *nn.Sequential
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 32, 1)
		return err
	}); err != nil {
		return "", err
	}
	step, err := s.Build(models.Spec, models.TrainStep(m, optimizer.NewAdam(optimizer.Constant(0.01))))
	if err != nil {
		return "", err
	}
	steps := 0
	for b, err := range dist.All(ctx) {
		if err != nil {
			return "", err
		}
		if _, err := s.Run(ctx, step, b); err != nil {
			return "", err
		}
		steps++
	}
	if steps != 6 {
		return "", fmt.Errorf("%d steps, expected 6", steps)
	}
	floats := slices.DeleteFunc(s.Variables(), func(v strategy.Variable) bool { return v.DType() != tf.Float })
	vals, err := strategy.ReadVariables(ctx, s, floats)
	return strategy.Fingerprint(vals), err
}
