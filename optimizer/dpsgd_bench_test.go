package optimizer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// BenchmarkDPSGDStep times b.N steps of the digits MLP on a global batch
// of 32 under the default strategy with plain SGD, then with DP-SGD
// (one gradient per example, clipped, and noise), in one run, and
// reports the time per step of each and their ratio, dp/sgd.
func BenchmarkDPSGDStep(b *testing.B) {
	timeSteps := func(opt strategy.Optimizer) time.Duration {
		var start time.Time
		plan := testmodel.Plan{Model: "mlp", Steps: b.N, MicroBatches: []int{32}, AfterRuns: func(done int) error {
			if done == 0 {
				start = time.Now() // after the build
			}
			return nil
		}}
		_, err := testmodel.TrainDefault(context.Background(), opt, plan)
		require.NoError(b, err)
		return time.Since(start)
	}
	sgd := timeSteps(optimizer.NewSGD(optimizer.Constant(0.1)))
	dp, err := optimizer.DPSGD(optimizer.NewSGD(optimizer.Constant(0.1)),
		optimizer.DPConfig{ClipNorm: 1, NoiseMultiplier: 1, ExpectedBatch: 32, MaxExamples: 32})
	require.NoError(b, err)
	private := timeSteps(dp)
	b.ReportMetric(float64(sgd.Microseconds())/float64(b.N), "sgd-µs/step")
	b.ReportMetric(float64(private.Microseconds())/float64(b.N), "dp-µs/step")
	b.ReportMetric(float64(private)/float64(sgd), "dp/sgd")
}
