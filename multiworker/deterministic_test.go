package multiworker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
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
