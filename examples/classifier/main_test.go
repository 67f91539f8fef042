package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

func flagsOf(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseFlags(args, io.Discard)
	require.NoError(t, err)
	return o
}

// readModel reads the float32 variables of s: the model's and the
// optimizer's.
func readModel(s strategy.Strategy) ([]strategy.VariableValue, error) {
	var vs []strategy.Variable
	for _, v := range s.Variables() {
		if v.DType() == tf.Float {
			vs = append(vs, v)
		}
	}
	return strategy.ReadVariables(context.Background(), s, vs)
}

// trained is what one worker's run gives.
type trained struct {
	res  result
	vals []strategy.VariableValue
}

// fitOn trains under s and reads its variables.
func fitOn(ctx context.Context, s strategy.Strategy, o options, out io.Writer) (trained, error) {
	res, err := fit(ctx, s, o, out)
	if err != nil {
		return trained{}, err
	}
	vals, err := readModel(s)
	return trained{res, vals}, err
}

// The command with its defaults reaches 95% held-out accuracy under the
// default strategy, printing each epoch and one JSON line of results.
func TestDefaultReachesNinetyFivePercent(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"-json"}, &stdout, &stderr), stderr.String())
	out := strings.TrimSpace(stdout.String())
	assert.Contains(t, out, "Epoch 10/10\n24/24 - ")
	var res result
	require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndex(out, "\n")+1:]), &res))
	t.Logf("held-out accuracy %.2f%%", 100*res.Accuracy)
	assert.GreaterOrEqual(t, res.Accuracy, 0.95)
	assert.Equal(t, result{Strategy: "default", Replicas: 1, Workers: 1, GlobalBatch: 64, Epochs: 10, Steps: 240, Chief: true},
		result{Strategy: res.Strategy, Replicas: res.Replicas, Workers: res.Workers, GlobalBatch: res.GlobalBatch, Epochs: res.Epochs, Steps: res.Steps, Chief: res.Chief})
}

// Mirrored on 2 devices and 2 workers of 2 devices each train the
// default strategy's model, element by element, and score it alike; only
// worker 0 reports.
func TestReplicasTrainTheDefaultModel(t *testing.T) {
	ctx := context.Background()
	args := []string{"-epochs", "3"}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want, err := fitOn(ctx, def, flagsOf(t, args...), io.Discard)
	require.NoError(t, err)
	check := func(what string, got trained) {
		diff, name, i := strategy.MaxDiff(want.vals, got.vals)
		assert.Less(t, diff, 1e-4, "%s: %s[%d]", what, name, i)
		assert.InDelta(t, want.res.FinalLoss, got.res.FinalLoss, 1e-5, what)
		assert.Equal(t, want.res.Accuracy, got.res.Accuracy, what)
	}

	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	got, err := fitOn(ctx, s, flagsOf(t, append(args, "-strategy", "mirrored")...), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 2, got.res.Replicas)
	check("mirrored x2", got)
	require.NoError(t, s.Close())

	o := flagsOf(t, append(args, "-strategy", "multiworker")...)
	workers := make([]trained, 2)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) (err error) {
			workers[w], err = fitOn(ctx, s, o, io.Discard)
			return err
		})
	for w := range 2 {
		require.NoError(t, errs[w], "worker %d", w)
		check(fmt.Sprintf("worker %d of 2x2", w), workers[w])
		assert.Equal(t, 4, workers[w].res.Replicas)
		assert.Equal(t, 2, workers[w].res.Workers)
		assert.Equal(t, w == 0, workers[w].res.Chief, "worker %d", w)
	}
}

// Under parameter servers (2 workers, 1 ps task) every scheduled step is
// applied once, the model reaches 95% held-out accuracy, and the chief
// exports the model it scored.
func TestParameterServersReachNinetyFivePercent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := testcluster.ParameterServers(t, ctx, 2, 1)
	defer s.Close()
	dir := filepath.Join(t.TempDir(), "digits")
	res, err := fit(ctx, s, flagsOf(t, "-strategy", "ps", "-epochs", "30", "-lr", "0.02", "-export-dir", dir), io.Discard)
	require.NoError(t, err)
	t.Logf("held-out accuracy %.2f%%", 100*res.Accuracy)
	assert.GreaterOrEqual(t, res.Accuracy, 0.95)
	assert.EqualValues(t, 30*24, res.Steps, "an epoch is as many steps as a pass takes")
	assert.Equal(t, res.Steps, res.AppliedSteps, "one update per scheduled step")
	assert.Equal(t, 2, res.Workers)
	assert.True(t, res.Chief)
	require.Equal(t, dir, res.ExportDir)
	assert.Equal(t, res.Accuracy, exportAccuracy(t, dir, 1))
}

// -export-dir writes a SavedModel that graft's LoadSavedModel loads and
// whose serving_default signature scores the held-out digits as the run
// did; -export-version -1 adds a version each run.
func TestExportDirServesTheTrainedModel(t *testing.T) {
	base := t.TempDir()
	for _, version := range []string{"1", "2"} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, run([]string{"-epochs", "2", "-seed", "3", "-export-dir", base, "-export-version", "-1", "-json"}, &stdout, &stderr), stderr.String())
		out := strings.TrimSpace(stdout.String())
		var res result
		require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndex(out, "\n")+1:]), &res))
		require.Equal(t, filepath.Join(base, version), res.ExportDir)
		assert.Contains(t, out, "SavedModel in "+res.ExportDir)
		assert.Equal(t, res.Accuracy, exportAccuracy(t, res.ExportDir, 3))
	}
}

// A run stopped after its second epoch and started again with the same
// -checkpoint-dir resumes at the third and ends with the model of a run
// never stopped; the backup is gone once training has ended.
func TestCheckpointDirResumesAfterAFailure(t *testing.T) {
	ctx := context.Background()
	args := []string{"-epochs", "4", "-checkpoint-every", "5"}
	want, err := fitDefault(ctx, flagsOf(t, args...), io.Discard)
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "backup")
	o := flagsOf(t, append(args, "-checkpoint-dir", dir)...)
	stopped, stop := context.WithCancel(ctx)
	_, err = fitDefault(stopped, o, stopAfter{"Epoch 3/4", stop})
	require.ErrorIs(t, err, context.Canceled)
	assert.DirExists(t, dir)
	var out bytes.Buffer
	got, err := fitDefault(ctx, o, &out)
	require.NoError(t, err)
	assert.NotContains(t, out.String(), "Epoch 2/4")
	assert.Contains(t, out.String(), "Epoch 3/4")
	diff, name, i := strategy.MaxDiff(want.vals, got.vals)
	assert.Zero(t, diff, "%s[%d]", name, i)
	assert.NoDirExists(t, dir)
}

// stopAfter cancels a run once its output has shown line.
type stopAfter struct {
	line   string
	cancel context.CancelFunc
}

func (s stopAfter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), s.line) {
		s.cancel()
	}
	return len(p), nil
}

// fitDefault trains under a default strategy of its own.
func fitDefault(ctx context.Context, o options, out io.Writer) (trained, error) {
	s, err := onedevice.New()
	if err != nil {
		return trained{}, err
	}
	defer s.Close()
	return fitOn(ctx, s, o, out)
}

// Bad flags are usage errors (exit status 2) naming the flag, the value
// and what was expected.
func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-strategy", "tpu"}, `-strategy "tpu": expected one of [default mirrored multiworker ps]`},
		{[]string{"-devices", "-1"}, "-devices -1: expected 0 or more"},
		{[]string{"-epochs", "0"}, "-epochs 0: expected at least 1"},
		{[]string{"-steps-per-epoch", "-3"}, "-steps-per-epoch -3: expected 0"},
		{[]string{"-global-batch", "0"}, "-global-batch 0: expected at least 1"},
		{[]string{"-lr", "NaN"}, "-lr NaN: expected a positive, finite learning rate"},
		{[]string{"-lr", "-0.1"}, "-lr -0.1: expected a positive"},
		{[]string{"-hidden", "0"}, "-hidden 0: expected at least 1"},
		{[]string{"-checkpoint-every", "-1"}, "-checkpoint-every -1: expected 0"},
		{[]string{"-export-dir", "m", "-export-version", "-2"}, "-export-version -2: expected a positive version, 0 for none or -1 for the next"},
		{[]string{"-export-version", "3"}, "-export-version 3: expected -export-dir too"},
		{[]string{"-log", "loud"}, `-log "loud": expected debug, info, warn or error`},
		{[]string{"-epochs", "two"}, `invalid value "two" for flag -epochs`},
		{[]string{"mirrored"}, `unexpected argument "mirrored"`},
	} {
		var stderr bytes.Buffer
		assert.Equal(t, 2, run(c.args, io.Discard, &stderr), "%q", c.args)
		assert.Contains(t, stderr.String(), c.want, "%q", c.args)
	}
	var stderr bytes.Buffer
	assert.Equal(t, 1, run([]string{"-strategy", "mirrored", "-devices", "3"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "-global-batch 64: expected a multiple of the 3 replicas in sync")
}

// exportAccuracy loads the SavedModel in dir and returns the share of the
// held-out digits of the split of seed that its serving_default signature
// classifies right.
func exportAccuracy(t *testing.T, dir string, seed uint64) float64 {
	t.Helper()
	all, err := digits.Load()
	require.NoError(t, err)
	_, test := all.Split(heldOut, seed)
	sm, err := tf.LoadSavedModel(dir, []string{savedmodel.ServeTag}, nil)
	require.NoError(t, err)
	defer sm.Session.Close()
	sig := sm.Signatures[savedmodel.DefaultSignature]
	x, err := tf.NewTensor(test.X)
	require.NoError(t, err)
	out, err := sm.Session.Run(map[tf.Output]*tf.Tensor{output(t, sm.Graph, sig.Inputs["x"].Name): x},
		[]tf.Output{output(t, sm.Graph, sig.Outputs["logits"].Name)}, nil)
	require.NoError(t, err)
	right := 0
	for i, row := range out[0].Value().([][]float32) {
		best := 0
		for c, v := range row {
			if v > row[best] {
				best = c
			}
		}
		if int32(best) == test.Y[i] {
			right++
		}
	}
	return float64(right) / float64(test.Len())
}

// output returns the tensor a signature names ("op:0").
func output(t *testing.T, g *tf.Graph, name string) tf.Output {
	t.Helper()
	require.True(t, strings.HasSuffix(name, ":0"), name)
	o := g.Operation(strings.TrimSuffix(name, ":0"))
	require.NotNil(t, o, name)
	return o.Output(0)
}
