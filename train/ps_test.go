package train_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/train"
)

// newPS starts a cluster of two workers and one ps task in this process
// and returns its chief's strategy.
func newPS(t *testing.T) *paramserver.Strategy {
	t.Helper()
	cl, err := paramserver.StartInProcessCluster(2, 1, paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := paramserver.New(ctx, cl.Resolver(), paramserver.WithStepTimeout(30*time.Second), paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// Under parameter servers Fit schedules StepsPerEpoch steps per epoch on
// the workers, each applied once, reaches 95% held-out accuracy on the
// digits, and Evaluate and Predict score the held-out set exactly, in
// order.
func TestFitParameterServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, held := digitsData(t)
	s := newPS(t)
	tr := compiledLR(t, s, 0.02)
	defer tr.Close()
	trainSet := dataset.Batched(dataset.Shuffle(sliceDS(t, d, d.Len()), d.Len(), 3), 32, true)
	val := dataset.Batched(sliceDS(t, held, held.Len()), 64, false)

	_, err := tr.Fit(ctx, trainSet, train.Epochs(2))
	require.ErrorContains(t, err, "StepsPerEpoch")

	h, err := tr.Fit(ctx, trainSet, train.Epochs(8), train.StepsPerEpoch(150), train.ValidationData(val))
	require.NoError(t, err)
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1200), applied, "every scheduled step applied once")
	t.Logf("held-out accuracy by epoch %v", h.Values["val_accuracy"])
	assert.GreaterOrEqual(t, h.Values["val_accuracy"][7], 0.95)

	logs, err := tr.Evaluate(ctx, val, 0)
	require.NoError(t, err)
	assert.InDelta(t, h.Values["val_loss"][7], logs["loss"], 1e-9)

	x := dataset.Batched(sliceDS(t, held, held.Len()), 50, false)
	pred, err := tr.Predict(ctx, x, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{int64(held.Len()), 10}, pred.Shape())
	right := 0
	for i, row := range pred.Value().([][]float32) {
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if int32(best) == held.Y[i] {
			right++
		}
	}
	assert.InDelta(t, logs["accuracy"], float64(right)/float64(held.Len()), 1e-9, "the predictions are in the data's order")
}
