package train_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/train"
)

// A NaN in one example of batch 3 makes that batch's loss NaN:
// TerminateOnNaN stops training after it, the first non-finite batch,
// although 3 epochs of 5 batches were asked for.
func TestTerminateOnNaNStopsAtFirstNaNBatch(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	x := slices.Clone(d.X[:100])
	x[3*20+7] = slices.Clone(x[3*20+7])
	x[3*20+7][11] = float32(math.NaN())
	ds, err := dataset.FromSlices(map[string]any{"x": x, "y": d.Y[:100]})
	require.NoError(t, err)
	ds = dataset.Batched(ds, 20, false)

	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	var losses []float64
	var steps int64
	seen := &train.LambdaCallback{BatchEnd: func(_ context.Context, r *train.Run, _ int, logs train.Logs) error {
		losses, steps = append(losses, logs["loss"]), r.Steps()
		return nil
	}}
	nan := &train.TerminateOnNaN{}
	h, err := tr.Fit(ctx, ds, train.Epochs(3), train.WithCallbacks(seen, nan))
	require.NoError(t, err)

	require.Len(t, losses, 4, "batches 0 to 3 trained")
	for i, l := range losses[:3] {
		assert.False(t, math.IsNaN(l) || math.IsInf(l, 0), "batch %d's loss %v", i, l)
	}
	assert.True(t, math.IsNaN(losses[3]), "batch 3's loss %v", losses[3])
	assert.Equal(t, int64(4), steps)
	epoch, batch, ok := nan.StoppedAt()
	assert.True(t, ok)
	assert.Equal(t, [2]int{0, 3}, [2]int{epoch, batch})
	assert.Equal(t, []int{0}, h.Epochs, "the stopped epoch ends; no other begins")
}
