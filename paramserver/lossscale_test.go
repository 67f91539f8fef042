package paramserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Loss scaling is refused when the step is built, naming the optimizer:
// workers update asynchronously, so no scale holds for a whole step.
// Bfloat16, which needs none, trains.
func TestLossScaleIsRefusedBfloat16Trains(t *testing.T) {
	s := newInProcess(t, 1, 1)
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = newMLP(sc, 64)
		return err
	}))
	ls, err := optimizer.NewLossScale(optimizer.NewSGD(nil))
	require.NoError(t, err)
	_, err = s.Build(models.Spec, models.TrainStep(m.WithPolicy(nn.MixedFloat16), ls))
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.ErrorContains(t, err, "optimizer *optimizer.LossScale scales the loss, which the parameter-server strategy does not support")

	ctx := testContext(t, time.Minute)
	train, eval := buildDigits(t, s, m.WithPolicy(nn.MixedBfloat16), optimizer.NewSGD(optimizer.Constant(0.1)))
	c := newCoordinator(t, s)
	trainData, test := digitsData(t)
	input := perWorkerDigits(t, c, trainData, 64)
	for range 200 {
		_, err := c.Schedule(train, input)
		require.NoError(t, err)
	}
	require.NoError(t, c.Join(ctx))
	assert.GreaterOrEqual(t, accuracy(t, ctx, c, eval, test), 0.9, "held-out accuracy of bfloat16 after 200 steps")
}

// DP-SGD is refused when the step is built, saying why: workers apply
// their updates asynchronously, which the privacy accounting does not
// cover.
func TestDPSGDIsRefused(t *testing.T) {
	s := newInProcess(t, 1, 1)
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = newMLP(sc, 64)
		return err
	}))
	dp, err := optimizer.DPSGD(optimizer.NewSGD(nil), optimizer.DPConfig{ClipNorm: 1, NoiseMultiplier: 1, ExpectedBatch: 64, MaxExamples: 64})
	require.NoError(t, err)
	_, err = s.Build(models.Spec, models.TrainStep(m, dp))
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.ErrorContains(t, err, "is DP-SGD, which the parameter-server strategy does not support: its workers apply their updates asynchronously")
}
