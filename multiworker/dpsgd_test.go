package multiworker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/strategy"
)

// DP-SGD on 2 workers of 2 replicas trains the default strategy's model on
// the same global batches, after 200 steps, without noise and with it
// (same seed): each example is clipped on its replica, the clipped sums
// travel in the all-reduce, and every replica of every worker adds the
// same noise once.
func TestDPSGDMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 200, MicroBatches: []int{32}}
	for _, sigma := range []float32{0, 1} {
		want, err := testmodel.TrainDefault(context.Background(), testmodel.PrivateSGD(t, sigma, 32), plan)
		require.NoError(t, err)
		got, _ := trainOnTwoWorkers(t, func() strategy.Optimizer { return testmodel.PrivateSGD(t, sigma, 8) }, plan)
		d, at := testmodel.MaxParamDiff(want, got[0])
		assert.Less(t, d, 1e-4, "σ %v: %s differs from the default strategy's by %v", sigma, at, d)
	}
}
