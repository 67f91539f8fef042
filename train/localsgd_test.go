package train_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	dto "github.com/prometheus/client_model/go"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/timeline"
	"github.com/tfdist/tfdist/train"
)

// Fit trains under local SGD (DiLoCo's outer update every 5 steps): each
// of 2 workers on its share of the data, its loss falling, and after the
// last synchronisation every worker holds the same model, bit for bit.
// Each synchronisation is counted in the metrics and is a span of the
// timeline.
func TestFitUnderLocalSGD(t *testing.T) {
	d, _ := digitsData(t)
	cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	var params [2][][]float32
	var hist [2]*train.History
	metrics, rec := monitoring.New("worker:0"), timeline.New(1<<12)
	errs := testcluster.OnWorkersWith(testcluster.LoopbackSpec(t, 2),
		func(w int) []multiworker.Option {
			if w == 0 {
				return workerOptions(multiworker.WithLocalSGD(cfg), multiworker.WithMonitoring(metrics), multiworker.WithTimeline(rec))
			}
			return workerOptions(multiworker.WithLocalSGD(cfg))
		},
		func(w int, s *multiworker.Strategy) error {
			tr := compiled(t, s)
			var err error
			if hist[w], err = tr.Fit(context.Background(), shuffled(t, d), train.Epochs(4)); err != nil {
				return err
			}
			values, err := s.Values(context.Background(), s.TrainableVariables())
			for _, v := range values {
				params[w] = append(params[w], tensorutil.Float32s(v))
			}
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	for w, h := range hist {
		losses := h.Values["loss"]
		require.Len(t, losses, 4)
		assert.Less(t, losses[3], losses[0], "worker %d's loss falls", w)
	}
	assert.Equal(t, params[0], params[1], "after the last synchronisation (step 20) the workers hold one model")
	var syncsServed dto.Metric
	require.NoError(t, metrics.Syncs.Write(&syncsServed))
	assert.Equal(t, 4.0, syncsServed.GetCounter().GetValue(), "20 steps, a synchronisation every 5")
	spans, _ := rec.Spans()
	syncs := 0
	for _, s := range spans {
		if s.Phase == timeline.Sync {
			syncs++
		}
	}
	assert.Equal(t, 4, syncs)
}
