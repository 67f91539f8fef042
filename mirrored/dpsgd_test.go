package mirrored_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
)

// DP-SGD on 2 and 4 devices trains the default strategy's model after 200
// steps, without noise and with it (same seed), and every replica's copies
// stay identical.
func TestDPSGDMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 200, MicroBatches: []int{32}}
	for _, sigma := range []float32{0, 1} {
		want, err := testmodel.TrainDefault(ctx, testmodel.PrivateSGD(t, sigma, 32), plan)
		require.NoError(t, err)
		for _, replicas := range []int{2, 4} {
			s, err := mirrored.New(mirrored.WithLogicalCPUs(replicas))
			require.NoError(t, err)
			got, err := testmodel.TrainPlan(ctx, s, testmodel.PrivateSGD(t, sigma, 32/replicas), plan)
			require.NoError(t, err)
			d, at := testmodel.MaxParamDiff(want, got)
			assert.Less(t, d, 1e-4, "σ %v, %d replicas: %s differs from the default strategy's by %v", sigma, replicas, at, d)
			differ, err := testmodel.DifferingCopies(ctx, s)
			require.NoError(t, err)
			assert.Empty(t, differ, "the replicas' copies differ")
			s.Close()
		}
	}
}
