package train_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/train"
)

// restoredLogs restores the checkpoint at prefix into a fresh model on the
// default strategy, and returns its evaluation on val and the checkpoint's
// metadata. opts are the restoring Saver's.
func restoredLogs(t *testing.T, prefix string, val dataset.Dataset, opts ...checkpoint.Option) (train.Logs, checkpoint.Metadata) {
	t.Helper()
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	sv, err := checkpoint.NewSaver(s, opts...)
	require.NoError(t, err)
	md, err := sv.Restore(ctx, prefix)
	require.NoError(t, err)
	logs, err := tr.Evaluate(ctx, val, 0)
	require.NoError(t, err)
	return logs, md
}

// checkpointVars lists the variables the checkpoint at prefix holds.
func checkpointVars(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := checkpoint.List(prefix)
	require.NoError(t, err)
	var vars []string
	for _, en := range entries {
		if !strings.HasPrefix(en.Name, checkpoint.MetadataPrefix) {
			vars = append(vars, en.Name)
		}
	}
	return vars
}

// With SaveBestOnly, ModelCheckpoint saves exactly the epochs whose
// val_loss beats every earlier one, each as ckpt-<steps> with its epoch
// and logs; the newest is the best, and restored into a fresh model it
// scores the best epoch's validation logs.
func TestModelCheckpointSavesBestOnly(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiledLR(t, s, 0.1)
	d, held := digitsData(t)
	ds := dataset.Batched(sliceDS(t, d, 60), 20, false)
	val := dataset.Batched(sliceDS(t, held, 100), 50, false)
	dir := t.TempDir()
	mc := &train.ModelCheckpoint{Dir: dir, SaveBestOnly: true, SaveWeightsOnly: true}
	h, err := tr.Fit(ctx, ds, train.Epochs(8), train.ValidationData(val), train.WithCallbacks(mc))
	require.NoError(t, err)

	vl := h.Values["val_loss"]
	var want []string
	for e := range vl {
		if e == 0 || vl[e] < slices.Min(vl[:e]) {
			want = append(want, filepath.Join(dir, fmt.Sprintf("ckpt-%d", 3*(e+1))))
		}
	}
	t.Logf("val_loss %.4f: saved %v", vl, want)
	require.Less(t, len(want), len(vl), "some epoch did not improve")
	assert.Equal(t, want, mc.Manager().Checkpoints())
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, files, 1+2*len(want), "the state file, and the index and data of each checkpoint")

	best := argmin(vl)
	latest, err := mc.Manager().Latest()
	require.NoError(t, err)
	assert.Equal(t, want[len(want)-1], latest)
	assert.ElementsMatch(t, []string{"mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/dense_1/kernel", "mlp/dense_1/bias"},
		checkpointVars(t, latest), "the model's variables only")
	logs, md := restoredLogs(t, latest, val)
	assert.InDelta(t, vl[best], logs["loss"], 1e-6)
	assert.InDelta(t, h.Values["val_accuracy"][best], logs["accuracy"], 1e-6)
	assert.Equal(t, int64(best), md[train.CheckpointEpochKey])
	assert.Equal(t, vl[best], md[train.CheckpointLogsPrefix+"val_loss"])
	assert.Equal(t, int64(3*(best+1)), md[checkpoint.GlobalStepKey])
}

// A callback that panics fails Fit with an error naming it, and the
// checkpoints ModelCheckpoint saved before are intact: the newest restores
// into a fresh model that scores the validation logs of its epoch.
func TestPanickingCallbackLeavesCheckpoints(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	dir := t.TempDir()
	mc := &train.ModelCheckpoint{Dir: dir, SaveWeightsOnly: true}
	boom := &train.LambdaCallback{Label: "exploding", BatchEnd: func(_ context.Context, r *train.Run, batch int, _ train.Logs) error {
		if r.Epoch() == 2 && batch == 1 {
			panic("boom")
		}
		return nil
	}}
	h, err := tr.Fit(ctx, ds, train.Epochs(4), train.ValidationData(val), train.WithCallbacks(mc, boom))
	require.ErrorContains(t, err, "callback exploding: OnBatchEnd: panic: boom")
	require.Equal(t, []int{0, 1}, h.Epochs)

	saved := mc.Manager().Checkpoints()
	require.Equal(t, []string{filepath.Join(dir, "ckpt-3"), filepath.Join(dir, "ckpt-6")}, saved)
	for e, prefix := range saved {
		logs, md := restoredLogs(t, prefix, val)
		assert.Equal(t, int64(e), md[train.CheckpointEpochKey])
		assert.InDelta(t, h.Values["val_loss"][e], logs["loss"], 1e-6, prefix)
	}
}

// With SaveFreq, ModelCheckpoint saves every SaveFreq batches counted
// across epochs, recording the epoch and the batch; SaveBestOnly on a
// validation key is then an error, as batches have no validation logs.
func TestModelCheckpointEveryNBatches(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	dir := t.TempDir()
	mc := &train.ModelCheckpoint{Dir: dir, SaveFreq: 2}
	_, err = tr.Fit(ctx, ds, train.Epochs(2), train.WithCallbacks(mc))
	require.NoError(t, err)
	saved := mc.Manager().Checkpoints()
	require.Equal(t, []string{filepath.Join(dir, "ckpt-2"), filepath.Join(dir, "ckpt-4"), filepath.Join(dir, "ckpt-6")}, saved)
	for i, want := range [][2]int64{{0, 1}, {1, 0}, {1, 2}} {
		_, md := restoredLogs(t, saved[i], val, checkpoint.WithAllowPartial(true))
		epoch, _ := md.Int64(train.CheckpointEpochKey)
		batch, _ := md.Int64(train.CheckpointBatchKey)
		assert.Equal(t, want, [2]int64{epoch, batch}, saved[i])
	}

	mc = &train.ModelCheckpoint{Dir: t.TempDir(), SaveFreq: 2, SaveBestOnly: true}
	_, err = tr.Fit(ctx, ds, train.Epochs(2), train.ValidationData(val), train.WithCallbacks(mc))
	require.ErrorContains(t, err, `callback ModelCheckpoint: OnBatchEnd: no Monitor "val_loss" in the logs of batch 1 of epoch 0, which have accuracy, loss`)
}
