package train_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/summary"
	"github.com/tfdist/tfdist/train"
)

// Two workers given the same paths run the same callbacks, and only the
// chief writes: after Fit the checkpoint directory holds the chief's
// checkpoints alone (every variable, the optimizer's slots too), intact —
// each restores into a fresh model that scores its epoch's validation
// logs — and one event file per TensorBoard directory, one CSV row per
// epoch, one progress output. EarlyStopping restores the best epoch's
// model on both.
func TestCallbacksWriteOnlyOnChief(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ckpts, csvPath, logdir := filepath.Join(dir, "ckpt"), filepath.Join(dir, "log.csv"), filepath.Join(dir, "tb")
	_, val := overfitting(t)
	var out [2]bytes.Buffer
	var hist [2]*train.History
	var evals [2]train.Logs
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(1),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			tr := compiled(t, s)
			ds, val := overfitting(t)
			var err error
			hist[w], err = tr.Fit(ctx, ds, train.Epochs(2), train.ValidationData(val), train.WithCallbacks(
				&train.ModelCheckpoint{Dir: ckpts},
				train.NewCSVLogger(csvPath),
				train.NewTensorBoard(logdir),
				train.NewProgressBar(&out[w], train.ProgressTerminal(false)),
				// The lowest accuracy is an early epoch's: restoring it shows.
				&train.EarlyStopping{Monitor: "val_accuracy", Mode: "min", Patience: 2, RestoreBestWeights: true}))
			if err == nil {
				evals[w], err = tr.Evaluate(ctx, val, 0)
			}
			return err
		})
	for w := range 2 {
		require.NoError(t, errs[w], "worker %d", w)
	}
	h := hist[0]
	best := argmin(h.Values["val_accuracy"])
	require.Less(t, best, 1, "an epoch before the last")
	for w := range 2 {
		assert.InDelta(t, h.Values["val_loss"][best], evals[w]["loss"], 1e-6, "worker %d has the best epoch's model", w)
	}

	assert.ElementsMatch(t, []string{"ckpt", "log.csv", "tb"}, dirNames(t, dir))
	assert.ElementsMatch(t, []string{"train", "validation"}, dirNames(t, logdir))
	assert.ElementsMatch(t, []string{"checkpoint", "ckpt-3.index", "ckpt-3.data-00000-of-00001",
		"ckpt-6.index", "ckpt-6.data-00000-of-00001"}, dirNames(t, ckpts))
	for e, step := range []string{"ckpt-3", "ckpt-6"} {
		prefix := filepath.Join(ckpts, step)
		assert.ElementsMatch(t, []string{"mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/dense_1/kernel", "mlp/dense_1/bias",
			"mlp/dense_0/kernel/KerasMomentum/momentum", "mlp/dense_0/bias/KerasMomentum/momentum",
			"mlp/dense_1/kernel/KerasMomentum/momentum", "mlp/dense_1/bias/KerasMomentum/momentum",
			"KerasMomentum/iterations"}, checkpointVars(t, prefix), "the model, the optimizer's slots and step count")
		logs, md := restoredLogs(t, prefix, val, checkpoint.WithAllowPartial(true))
		assert.Equal(t, int64(e), md[train.CheckpointEpochKey])
		assert.InDelta(t, h.Values["val_loss"][e], logs["loss"], 1e-5, prefix)
	}

	assert.Len(t, readCSV(t, csvPath, ','), 3, "a header and a row per epoch")
	for _, sub := range []string{"train", "validation"} {
		events, err := summary.EventFiles(filepath.Join(logdir, sub))
		require.NoError(t, err)
		assert.Len(t, events, 1, sub)
	}
	assert.Contains(t, out[0].String(), "Epoch 2/2\n3/3 - ")
	assert.Empty(t, out[1].String(), "the other worker prints nothing")
}

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	return names
}
