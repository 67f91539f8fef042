package mirrored_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Clipping by global norm on 2 devices: the norm is that of the
// all-reduced gradient, so both replicas clip by the same factor — their
// copies stay bit-identical — and the model equals the default strategy's
// on the global batch. Clipping by value too.
func TestClippingMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 10, MicroBatches: []int{32}}
	sgd := func() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }
	unclipped, err := testmodel.TrainDefault(ctx, sgd(), plan)
	require.NoError(t, err)
	for name, clip := range map[string]func(strategy.Optimizer, float32) (*optimizer.Clipped, error){
		"ClipByGlobalNorm": optimizer.ClipByGlobalNorm, "ClipByValue": optimizer.ClipByValue,
	} {
		opt := func() strategy.Optimizer {
			o, err := clip(sgd(), 0.01)
			require.NoError(t, err)
			return o
		}
		want, err := testmodel.TrainDefault(ctx, opt(), plan)
		require.NoError(t, err)
		d, _ := testmodel.MaxParamDiff(want, unclipped)
		assert.Greater(t, d, 1e-3, "%s: the clip changes the model", name)

		s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
		require.NoError(t, err)
		defer s.Close()
		trainMatching(t, s, opt(), plan, want, name)
	}
}
