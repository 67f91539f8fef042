package multiworker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Clipping by global norm on 2 workers of 2 replicas: the norm is that of
// the all-reduced gradient, so every replica of every worker clips by the
// same factor — all copies stay bit-identical — and the model equals the
// default strategy's on the global batch.
func TestClipByGlobalNormMatchesDefault(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 10, MicroBatches: []int{32}}
	clipped := func() strategy.Optimizer {
		opt, err := optimizer.ClipByGlobalNorm(optimizer.NewSGD(optimizer.Constant(0.5)), 0.05)
		require.NoError(t, err)
		return opt
	}
	want, err := testmodel.TrainDefault(context.Background(), clipped(), plan)
	require.NoError(t, err)
	got, _ := trainOnTwoWorkers(t, clipped, plan)
	d, at := testmodel.MaxParamDiff(want, got[0])
	assert.Less(t, d, 1e-5, "%s differs from the default strategy's by %v", at, d)
}
