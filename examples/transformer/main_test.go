package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// tiny returns options for runs of a few seconds on the standard
// library's source, in epochs of one step, so that a report's epoch
// losses are every step's loss.
func tiny(t *testing.T) options {
	t.Helper()
	dir, err := goSource()
	require.NoError(t, err)
	o := defaults()
	o.corpus = dir
	o.trainBytes, o.evalBytes = 64<<10, 1<<10
	o.steps, o.globalBatch, o.seqLen = 4, 8, 16
	o.width, o.heads, o.layers = 16, 2, 2
	o.warmup, o.logEvery, o.sample = 1, 1, 8
	return o
}

// fitOn trains with o under the strategy dc names, in this process.
func fitOn(t *testing.T, o options, dc distribute.Config) report {
	t.Helper()
	s, err := distribute.Open(context.Background(), dc)
	require.NoError(t, err)
	defer s.Close()
	o.dist = dc
	rep, err := fit(context.Background(), s, o, io.Discard)
	require.NoError(t, err, "strategy %s ×%d", dc.Strategy, dc.Devices)
	return rep
}

// fitOnWorkers trains with o on a cluster of workers in this process,
// each with devices replicas and opts, and returns each worker's report.
func fitOnWorkers(t *testing.T, o options, workers, devices int, opts ...multiworker.Option) []report {
	t.Helper()
	o.dist = distribute.Config{Strategy: "multiworker", Devices: devices}
	reps := make([]report, workers)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, workers), append(opts, multiworker.WithLogicalCPUs(devices)),
		func(w int, s *multiworker.Strategy) (err error) {
			reps[w], err = fit(context.Background(), s, o, io.Discard)
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return reps
}

// inert reports whether the variable named name is an attention layer's
// key bias, whose gradient is zero in exact arithmetic: softmax ignores a
// shift that every key shares, and the bias shifts each query's scores of
// all keys by the same q·b. Its value is the rounding noise of that zero
// (Adam's normalisation makes a noise gradient move it by ~1e-6 per step
// here), so no two summation orders agree on it; it is compared by how
// close to 0 it stays instead.
func inert(name string) bool { return strings.HasSuffix(name, "/key/bias") }

// inertBound is how far from 0 an inert variable may drift in the tests'
// few steps, where every other bias moves by ~1e-2.
const inertBound = 1e-4

// requireSameVariables fails unless got holds want's variables, element
// by element within tol of each variable's largest magnitude
// (strategy.MaxDiff), naming the variable and the index of the largest
// difference; inert variables must stay within inertBound of 0 in both.
func requireSameVariables(t *testing.T, want, got []strategy.VariableValue, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	var w, g []strategy.VariableValue
	for k := range want {
		if !inert(want[k].Name) {
			w, g = append(w, want[k]), append(g, got[k])
			continue
		}
		for i := range want[k].Float32 {
			require.LessOrEqual(t, math.Abs(float64(want[k].Float32[i])), inertBound, "%s: %s[%d] in one device", what, want[k].Name, i)
			require.LessOrEqual(t, math.Abs(float64(got[k].Float32[i])), inertBound, "%s: %s[%d]", what, got[k].Name, i)
		}
	}
	diff, name, index := strategy.MaxDiff(w, g)
	msg := fmt.Sprintf("%s: largest difference %.3g of its variable's scale in %s[%d]", what, diff, name, index)
	for k := range w {
		if w[k].Name == name && index >= 0 && index < len(w[k].Float32) {
			msg += fmt.Sprintf(": %g, expected %g", g[k].Float32[index], w[k].Float32[index])
		}
	}
	require.LessOrEqual(t, diff, tol, msg)
	t.Log(msg)
}

// requireSameLosses fails unless every epoch's training loss and the
// held-out loss agree within tol, relative.
func requireSameLosses(t *testing.T, want, got report, tol float64, what string) {
	t.Helper()
	require.Len(t, got.TrainLosses, len(want.TrainLosses), what)
	for i := range want.TrainLosses {
		require.InEpsilon(t, want.TrainLosses[i], got.TrainLosses[i], tol, "%s: epoch %d's loss", what, i+1)
	}
	require.InEpsilon(t, want.HeldOutLoss, got.HeldOutLoss, tol, "%s: held-out loss", what)
}

// N replicas train the model of one device: with the same seed, data
// order and global batch, Mirrored ×2 and ×4 and two workers of two
// replicas each end with the default strategy's variables, every element
// of every variable, the same loss at every step, the same held-out loss
// and the same sample.
func TestReplicasEqualOneDevice(t *testing.T) {
	o := tiny(t)
	one := fitOn(t, o, distribute.Config{Strategy: "default"})
	require.NotEmpty(t, one.Variables)
	require.Len(t, one.TrainLosses, o.steps/o.logEvery)
	for _, devices := range []int{2, 4} {
		what := fmt.Sprintf("mirrored ×%d", devices)
		rep := fitOn(t, o, distribute.Config{Strategy: "mirrored", Devices: devices})
		requireSameVariables(t, one.Variables, rep.Variables, 1e-4, what)
		requireSameLosses(t, one, rep, 1e-4, what)
		assert.Equal(t, one.Sample, rep.Sample, what)
	}
	for w, rep := range fitOnWorkers(t, o, 2, 2) {
		what := fmt.Sprintf("multiworker 2×2, worker %d", w)
		requireSameVariables(t, one.Variables, rep.Variables, 1e-4, what)
		requireSameLosses(t, one, rep, 1e-4, what)
		assert.Equal(t, one.Sample, rep.Sample, what)
	}
}

// The variables compared are every variable of the model, and training
// moves each of them by at least 1e-4 (Adam moves an element by up to the
// learning rate, 3e-3, per step), but the inert key biases, which start
// at 0 and stay within inertBound of it.
func TestEveryVariableTrains(t *testing.T) {
	ctx := context.Background()
	o := tiny(t)
	tr, d, _ := compileOnOneDevice(t, o)
	initial, err := variables(ctx, tr)
	require.NoError(t, err)
	require.NoError(t, trainOn(ctx, tr, d.train, o, io.Discard, &report{}))
	trained, err := variables(ctx, tr)
	require.NoError(t, err)
	names := map[string]bool{}
	for k, v := range trained {
		names[v.Name] = true
		moved, largest := 0.0, 0.0
		for i, x := range v.Float32 {
			moved = max(moved, math.Abs(float64(x-initial[k].Float32[i])))
			largest = max(largest, math.Abs(float64(x)))
		}
		if inert(v.Name) {
			assert.LessOrEqual(t, largest, inertBound, "%s, inert, drifted", v.Name)
		} else {
			assert.GreaterOrEqual(t, moved, 1e-4, "%s did not train", v.Name)
		}
	}
	// Embeddings, 2 blocks of (2 LayerNorms, attention's 4 kernels and
	// 4 biases, 2 Dense layers), the final LayerNorm and Dense.
	assert.Len(t, names, 2+2*(2*2+8+2*2)+2+2, "variables: %v", names)
}

// compileOnOneDevice compiles o's model on a one-device strategy, closed
// when the test ends, and returns it with o's text and its batches.
func compileOnOneDevice(t *testing.T, o options) (*train.Trainer, data, corpus) {
	t.Helper()
	text, err := loadCorpus(o.corpus, int(o.trainBytes), int(o.evalBytes))
	require.NoError(t, err)
	d, err := batches(text, o)
	require.NoError(t, err)
	s, err := onedevice.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	tr, err := compile(s, o)
	require.NoError(t, err)
	return tr, d, text
}

// The compiled loss is the mean cross-entropy per character: Evaluate's
// held-out loss, over a full batch and a partial one, equals the mean over
// every held-out character of -log softmax(logits)[next], computed here
// from Predict's logits.
func TestLossIsPerCharacterMean(t *testing.T) {
	ctx := context.Background()
	o := tiny(t)
	o.evalBytes = 200 // 12 windows of 16: a full batch of 8 and a partial one
	tr, d, text := compileOnOneDevice(t, o)
	logs, err := tr.Evaluate(ctx, d.heldOut, 0)
	require.NoError(t, err)
	pred, err := tr.Predict(ctx, d.heldOut, 0)
	require.NoError(t, err)
	logits := pred.Value().([][][]float32)
	_, next := windows(text.eval, o.seqLen)
	require.Len(t, logits, len(next))
	sum := 0.0
	for i, row := range logits {
		for j, l := range row {
			sum += crossEntropy(l, next[i][j])
		}
	}
	assert.InEpsilon(t, sum/float64(d.heldOutChars), logs["loss"], 1e-5)
}

// crossEntropy returns -log softmax(logits)[label].
func crossEntropy(logits []float32, label int32) float64 {
	top := math.Inf(-1)
	for _, l := range logits {
		top = max(top, float64(l))
	}
	z := 0.0
	for _, l := range logits {
		z += math.Exp(float64(l) - top)
	}
	return top + math.Log(z) - float64(logits[label])
}

// Under parameter servers (two workers of one device, one ps task), with
// Adam for every variable, the looked-up embeddings included, the chief's
// coordinator applies every scheduled step once and the model learns: in
// 150 steps at a rate of 1e-2 the held-out loss falls more than a nat per
// character below ln(vocabulary), the loss of a model that knows nothing
// (3.1-3.2 nats, against 4.58, in our runs; the asynchronous updates make
// each run different).
func TestParameterServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := testcluster.ParameterServers(t, ctx, 2, 1)
	defer s.Close()
	o := tiny(t)
	o.dist = distribute.Config{Strategy: "ps"}
	o.steps, o.logEvery, o.evalBytes, o.lr = 150, 50, 4<<10, 1e-2
	rep, err := fit(ctx, s, o, io.Discard)
	require.NoError(t, err)
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(o.steps), applied)
	assert.Len(t, rep.TrainLosses, o.steps/o.logEvery)
	assert.Less(t, rep.HeldOutLoss, math.Log(vocabSize)-1)
	assert.Len(t, []rune(rep.Sample), len(o.prompt)+o.sample)
	t.Logf("held-out loss %.4f nats per character, ln(vocabulary) %.4f; train losses %.4f", rep.HeldOutLoss, math.Log(vocabSize), rep.TrainLosses)
}

// A corpus that holds no .go files, or that cannot be read, is an error
// naming its path.
func TestCorpusErrors(t *testing.T) {
	empty := t.TempDir()
	noGo := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(noGo, "notes.txt"), []byte("not Go"), 0o644))
	few := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(few, "a.go"), []byte("package a\n"), 0o644))
	file := filepath.Join(noGo, "notes.txt")
	missing := filepath.Join(empty, "missing")
	for path, want := range map[string]string{
		empty: "no .go files", noGo: "no .go files", few: "1 .go files, expected at least 10",
		file: "no .go files", missing: "no such file or directory",
	} {
		_, err := loadCorpus(path, 1<<10, 1<<10)
		require.Error(t, err, path)
		assert.Contains(t, err.Error(), path)
		assert.Contains(t, err.Error(), want)

		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), []string{"-corpus", path, "-steps", "1", "-log-every", "1"}, &stdout, &stderr)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr.String(), "corpus "+path)
	}
}

// The held-out set is whole files that never train, every tenth in
// sorted order, and a character stays itself through encode and decode.
func TestCorpusSplit(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		text := fmt.Sprintf("package p%02d\n", i)
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d.go", i)), []byte(text), 0o644))
	}
	c, err := loadCorpus(dir, 1<<20, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, 18, c.trainFiles)
	assert.Equal(t, 2, c.evalFiles)
	assert.Equal(t, "package p09\npackage p19\n", decode(c.eval))
	assert.NotContains(t, decode(c.train), "p09")
	assert.NotContains(t, decode(c.train), "p19")

	capped, err := loadCorpus(dir, 30, 5)
	require.NoError(t, err)
	assert.Equal(t, "package p00\npackage p01\npackag", decode(capped.train))
	assert.Equal(t, "packa", decode(capped.eval))

	text := "func main() {\n\tprintln(\"~ héllo\")\n}\n"
	assert.Equal(t, strings.Replace(text, "é", "\uFFFD\uFFFD", 1), decode(encode([]byte(text))))
}

// The bigram statistics of a text whose next character follows from the
// previous one: no entropy.
func TestBigram(t *testing.T) {
	ids := encode([]byte(strings.Repeat("ab", 10000)))
	st := bigram(ids, ids)
	assert.InDelta(t, 0, st.Entropy, 1e-12)
	assert.InDelta(t, math.Log(2), st.Unigram, 1e-3)
	assert.Less(t, st.HeldOut, 0.01)
}

// The command trains end to end, prints the bigram entropy, the loss
// lines, the held-out loss and a sample, and its -json line.
func TestMainEndToEnd(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"-strategy", "mirrored", "-devices", "2", "-train-bytes", "64KiB", "-eval-bytes", "4KiB",
		"-steps", "6", "-global-batch", "8", "-seq-len", "16", "-width", "16", "-heads", "2", "-layers", "2",
		"-log-every", "3", "-sample", "40", "-summary", "-json"}
	code := Main(context.Background(), args, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	out := stdout.String()
	t.Log(out)
	for _, want := range []string{"bigram entropy H(next|previous)", "step    3/6  loss", "step    6/6  loss",
		"held-out loss", "sample (temperature 0.8):\nfunc ", "Total params"} {
		assert.Contains(t, out, want)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &rep))
	for _, key := range []string{"final_train_loss", "held_out_loss", "bigram_entropy", "tokens_per_sec"} {
		assert.Greater(t, rep[key], 0.0, key)
	}
	assert.Len(t, rep["train_losses"], 2)
	assert.Len(t, []rune(rep["sample"].(string)), len("func ")+40)
}

// Flags the command cannot run with are usage errors (status 2), and
// settings the data or the strategy cannot serve are errors (status 1),
// each saying what is wrong.
func TestFlagErrors(t *testing.T) {
	small := []string{"-train-bytes", "64KiB", "-eval-bytes", "1KiB", "-sample", "0"}
	empty := t.TempDir()
	missing := filepath.Join(empty, "ckpt-100")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-heads", "3"}, 2, "-heads 3: expected a positive divisor of -width 64"},
		{[]string{"-steps", "0"}, 2, "-steps 0"},
		{[]string{"-steps", "250"}, 2, "-steps 250: expected a multiple of -log-every 100"},
		{[]string{"-strategy", "ps", "-devices", "2"}, 2, "-strategy ps -devices 2: each worker runs its steps on one device"},
		{[]string{"-train-bytes", "1XB"}, 2, `"1XB": expected a number of bytes`},
		{[]string{"extra"}, 2, `unexpected arguments ["extra"]`},
		{append([]string{"-strategy", "mirrored", "-devices", "2", "-global-batch", "3"}, small...), 1, "global batch size 3 by 2 replicas"},
		{append([]string{"-eval-bytes", "10", "-seq-len", "16"}, small[:2]...), 1, "held-out text: 10 characters, fewer than one sequence of 17"},
		{[]string{"-decay-steps", "-1"}, 2, "-decay-steps -1: expected 0 (-steps) or more"},
		{[]string{"-optimizer", "adagrad"}, 2, `-optimizer "adagrad": expected one of adam, adamw, lamb, sgd`},
		{[]string{"-accumulate", "0"}, 2, "-accumulate 0: expected 1 (no accumulation) or more"},
		{[]string{"-save-dir", "a", "-evaluate-checkpoint", "b"}, 2, "-evaluate-checkpoint b, -save-dir a: expected one or the other"},
		{[]string{"-strategy", "multiworker", "-diloco", "10", "-evaluate-checkpoint", "b"}, 2, "-evaluate-checkpoint b with -local-sgd or -diloco"},
		{append([]string{"-evaluate-checkpoint", missing}, small...), 1, "-evaluate-checkpoint " + missing + ": neither a checkpoint nor a directory of checkpoints"},
		{append([]string{"-evaluate-checkpoint", empty}, small...), 1, "-evaluate-checkpoint " + empty + ": a directory without checkpoints"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), c.args, &stdout, &stderr)
		assert.Equal(t, c.code, code, "%v", c.args)
		assert.Contains(t, stderr.String(), c.want, "%v", c.args)
	}
}

// Sharded optimizer state trains the Transformer unsharded training
// trains: 200 steps of Adam on 2 workers at stages 1 and 2, of AdamW and
// LAMB on 2 workers at stage 2 and of LAMB on 4 workers at stage 1 end
// with the unsharded job's variables, bit for bit (LAMB's norm of an
// update, summed over the shards, is the whole's). Each worker holds
// 1/workers of the optimizer's state.
func TestZeROTrainsTheUnshardedModel(t *testing.T) {
	o := tiny(t)
	o.steps, o.logEvery, o.sample = 200, 100, 0
	for _, c := range []struct {
		optimizer string
		workers   int
		stages    []int
	}{{"adam", 2, []int{1, 2}}, {"adamw", 2, []int{2}}, {"lamb", 2, []int{2}}, {"lamb", 4, []int{1}}} {
		o.optimizer = c.optimizer
		want := fitOnWorkers(t, o, c.workers, 1)
		for _, stage := range c.stages {
			for w, rep := range fitOnWorkers(t, o, c.workers, 1, multiworker.WithZeRO(stage)) {
				what := fmt.Sprintf("%s on %d workers, stage %d, worker %d", c.optimizer, c.workers, stage, w)
				diff, name, index := strategy.MaxDiff(want[0].Variables, rep.Variables)
				require.Zero(t, diff, "%s: %s[%d]", what, name, index)
				share := float64(rep.StateBytes) / float64(want[0].StateBytes)
				require.InDelta(t, 1/float64(c.workers), share, 0.01, "%s: its share of the optimizer state", what)
			}
		}
	}
}

// The peak resident memory the -json line reports counts memory the
// process has touched: after 256 MiB more is written, it is at least
// that much above the resident memory before.
func TestPeakRSSCountsTouchedMemory(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc: the peak is left out of the report")
	}
	debug.FreeOSMemory() // so that the buffer below cannot reuse resident pages the heap has freed
	before := procStatus("VmRSS")
	require.Positive(t, before)
	buf := make([]byte, 256<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	after := peakRSS()
	assert.GreaterOrEqual(t, after-before, int64(len(buf)), "the peak after touching %d bytes", len(buf))
	assert.Equal(t, byte(255), buf[len(buf)-1])
}
