package train_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// Predict returns every example's prediction in the data's order: under
// mirrored x2 and on each of two workers of two devices, a trained model's
// predictions of 297 examples in batches of 64 (the last one partial,
// split unevenly) equal the default strategy's, element by element.
func TestPredictKeepsTheDataOrder(t *testing.T) {
	ctx := context.Background()
	d, held := digitsData(t)
	x, err := dataset.FromSlices(map[string]any{"x": held.X})
	require.NoError(t, err)
	predict := func(s strategy.Strategy) *tf.Tensor {
		tr := compiled(t, s)
		_, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(1))
		require.NoError(t, err)
		p, err := tr.Predict(ctx, dataset.Batched(x, 64, false), 0)
		require.NoError(t, err)
		return p
	}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want := predict(def)
	require.Equal(t, []int64{int64(held.Len()), 10}, want.Shape())

	same := func(what string, got *tf.Tensor) {
		require.Equal(t, want.Shape(), got.Shape(), what)
		w, g := want.Value().([][]float32), got.Value().([][]float32)
		for i := range w {
			assert.InDeltaSlice(t, w[i], g[i], 1e-4, "%s: example %d", what, i)
		}
	}
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	same("mirrored x2", predict(s))
	require.NoError(t, s.Close())

	got := make([]*tf.Tensor, 2)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			got[w] = predict(s)
			return nil
		})
	for w := range 2 {
		require.NoError(t, errs[w])
		same("worker of 2x2", got[w])
	}
}
