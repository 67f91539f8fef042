package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/multiworker"
)

// tinyArgs are the flags of tiny's settings, for Main.
func tinyArgs(o options) []string {
	return []string{"-corpus", o.corpus, "-train-bytes", "64KiB", "-eval-bytes", "1KiB", "-global-batch", "8", "-seq-len", "16",
		"-width", "16", "-heads", "2", "-layers", "2", "-sample", "0"}
}

// scoreOnly runs the command under -evaluate-checkpoint path with tiny's
// settings and args and returns its -json report.
func scoreOnly(t *testing.T, o options, path string, args ...string) report {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), append(append(tinyArgs(o), "-evaluate-checkpoint", path, "-json"), args...), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var rep report
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &rep))
	return rep
}

// -save-dir saves the weights after every epoch as ckpt-STEP, and
// -evaluate-checkpoint, on one device, scores the last one exactly as the
// training run's own Evaluate scored its model, with its variables bit for
// bit; given the directory, it scores every checkpoint in the order of
// their steps. Each epoch's record has its step and the training seconds
// so far, the saves left out; the default strategy sends no bytes.
func TestEvaluateCheckpointScoresTheSavedModel(t *testing.T) {
	o := tiny(t)
	o.steps, o.logEvery, o.sample = 4, 2, 0
	o.saveDir = t.TempDir()
	run := fitOn(t, o, distribute.Config{Strategy: "default"})
	require.Len(t, run.Epochs, 2)
	for i, e := range run.Epochs {
		assert.Equal(t, 2*(i+1), e.Step)
		assert.Equal(t, run.TrainLosses[i], e.Loss)
		assert.Zero(t, e.BytesSent)
	}
	assert.Less(t, run.Epochs[0].Seconds, run.Epochs[1].Seconds)
	assert.Equal(t, run.TrainSeconds, run.Epochs[1].Seconds)
	assert.Positive(t, run.SaveSeconds)
	for _, name := range []string{"ckpt-2.index", "ckpt-4.index"} {
		assert.FileExists(t, filepath.Join(o.saveDir, name))
	}

	last := scoreOnly(t, o, filepath.Join(o.saveDir, "ckpt-4"))
	assert.Equal(t, run.ParamsSHA256, last.ParamsSHA256, "the restored weights")
	assert.InEpsilon(t, run.HeldOutLoss, last.HeldOutLoss, 1e-6)
	assert.Equal(t, 4, last.Steps)
	assert.Equal(t, run.HeldOutChars, last.HeldOutChars)

	all := scoreOnly(t, o, o.saveDir)
	require.Len(t, all.Checkpoints, 2)
	assert.Equal(t, int64(2), all.Checkpoints[0].Step)
	assert.Equal(t, int64(4), all.Checkpoints[1].Step)
	assert.Equal(t, last.HeldOutLoss, all.Checkpoints[1].HeldOutLoss)
	assert.Greater(t, all.Checkpoints[0].HeldOutLoss, all.Checkpoints[1].HeldOutLoss, "training goes on lowering the loss")
	assert.Equal(t, last.ParamsSHA256, all.ParamsSHA256, "the last one scored is the newest")

	var stdout, stderr bytes.Buffer
	args := append(tinyArgs(o), "-evaluate-checkpoint", o.saveDir, "-width", "32")
	require.Equal(t, 1, Main(context.Background(), args, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "-evaluate-checkpoint "+o.saveDir+": checkpoint: restore ")
	assert.Contains(t, stderr.String(), "the checkpoint has float32[98 16], the model has float32[98 32]")
}

// Under DiLoCo, a checkpoint saved at the end of an epoch that ends with
// a synchronisation (-log-every a multiple of H) holds the model every
// worker holds then, so the offline score is every worker's; each epoch's
// bytes are those of the synchronisations, the saves left out.
func TestCheckpointAfterSynchronisation(t *testing.T) {
	o := tiny(t)
	o.steps, o.logEvery, o.sample = 4, 2, 0
	o.saveDir = t.TempDir()
	l := multiworker.LocalSGD{Steps: 2, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	o.dist = distribute.Config{Strategy: "multiworker", LocalSGD: &l}
	reps := make([]report, 2)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLocalSGD(l)},
		func(w int, s *multiworker.Strategy) (err error) {
			reps[w], err = fit(context.Background(), s, o, io.Discard)
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	assert.Equal(t, reps[0].ParamsSHA256, reps[1].ParamsSHA256, "after a synchronisation every worker holds one model")
	score := scoreOnly(t, o, filepath.Join(o.saveDir, "ckpt-4"))
	assert.Equal(t, reps[0].ParamsSHA256, score.ParamsSHA256, "the checkpoint holds it")

	for w, rep := range reps {
		require.Len(t, rep.Epochs, 2, "worker %d", w)
		// Each epoch's 2 steps end with a synchronisation, the all-reduce
		// of the outer gradient: the model's float32 parameters, about
		// what a ring all-reduce of 2 members sends of them.
		params := 4 * rep.Params
		first, second := rep.Epochs[0].BytesSent, rep.Epochs[1].BytesSent-rep.Epochs[0].BytesSent
		assert.InEpsilon(t, params, second, 0.1, "worker %d: the second epoch's bytes", w)
		assert.GreaterOrEqual(t, first, second, "worker %d: the first epoch's bytes, with the start's broadcast", w)
		t.Logf("worker %d: %d parameters; bytes sent in each epoch %d, %d; by the saves %d", w, rep.Params, first, second, rep.SaveBytesSent)
	}
	_, err := os.Stat(filepath.Join(o.saveDir, "ckpt-2.index"))
	assert.NoError(t, err)
}
