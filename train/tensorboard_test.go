package train_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/summary"
	"github.com/tfdist/tfdist/train"
)

// scalarsIn reads the one event file of dir, by tag and step.
func scalarsIn(t *testing.T, dir string) map[string]map[int64]float64 {
	t.Helper()
	files, err := summary.EventFiles(dir)
	require.NoError(t, err)
	require.Len(t, files, 1, dir)
	scalars, err := summary.ReadScalars(files[0])
	require.NoError(t, err)
	out := map[string]map[int64]float64{}
	for _, s := range scalars {
		if out[s.Tag] == nil {
			out[s.Tag] = map[int64]float64{}
		}
		out[s.Tag][s.Step] = s.Value
	}
	return out
}

// eventValue is v as an event file holds it.
func eventValue(v float64) float64 { return float64(float32(v)) }

// TensorBoard writes Keras's layout: train/ holds "epoch_"+key of every
// training log at each epoch — the learning rate too when the logs carry
// it — and every UpdateFreq steps "batch_"+key of the batch logs, at the
// step count; validation/ holds each "val_" log as "epoch_"+key. Every
// value is History's (or the batch's logs).
func TestTensorBoardWritesKerasLayout(t *testing.T) {
	ctx := context.Background()
	s, err := strategy.Default()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	logdir := t.TempDir()
	batches := map[int64]train.Logs{}
	record := &train.LambdaCallback{
		BatchEnd: func(_ context.Context, r *train.Run, _ int, logs train.Logs) error {
			batches[r.Steps()] = logs
			return nil
		},
		EpochEnd: func(_ context.Context, _ *train.Run, epoch int, logs train.Logs) error {
			logs["learning_rate"] = 0.05 / float64(epoch+1) // as a schedule's callback would
			return nil
		},
	}
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.ValidationData(val),
		train.WithCallbacks(record, train.NewTensorBoard(logdir, train.TensorBoardUpdateFreq(2))))
	require.NoError(t, err)

	got := scalarsIn(t, filepath.Join(logdir, "train"))
	want := map[string]map[int64]float64{}
	for _, k := range []string{"loss", "accuracy", "learning_rate"} {
		want["epoch_"+k] = map[int64]float64{0: eventValue(h.Values[k][0]), 1: eventValue(h.Values[k][1])}
	}
	for _, k := range []string{"loss", "accuracy"} {
		want["batch_"+k] = map[int64]float64{}
		for _, step := range []int64{2, 4, 6} {
			want["batch_"+k][step] = eventValue(batches[step][k])
		}
	}
	assert.Equal(t, want, got)

	got = scalarsIn(t, filepath.Join(logdir, "validation"))
	want = map[string]map[int64]float64{}
	for _, k := range []string{"loss", "accuracy"} {
		want["epoch_"+k] = map[int64]float64{0: eventValue(h.Values["val_"+k][0]), 1: eventValue(h.Values["val_"+k][1])}
	}
	assert.Equal(t, want, got)
}
