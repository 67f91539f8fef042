package testmodel

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// PrivateSGD returns the DP-SGD optimizer the strategies' equivalence
// tests train with: SGD at 0.5, clip norm 1, noise multiplier sigma, an
// expected global batch of 32, at most perReplica examples per replica and
// seed 5.
func PrivateSGD(t testing.TB, sigma float32, perReplica int) strategy.Optimizer {
	t.Helper()
	opt, err := optimizer.DPSGD(optimizer.NewSGD(optimizer.Constant(0.5)),
		optimizer.DPConfig{ClipNorm: 1, NoiseMultiplier: sigma, ExpectedBatch: 32, MaxExamples: perReplica, Seed: 5})
	require.NoError(t, err)
	return opt
}
