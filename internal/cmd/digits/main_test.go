package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/tfdist/tfdist/internal/classifier"
	"github.com/tfdist/tfdist/internal/pyenv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/accountant"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/strategy"
)

func options(t testing.TB, args ...string) classifier.Options {
	t.Helper()
	o, err := classifier.ParseFlags(args, io.Discard)
	require.NoError(t, err)
	return o
}

// assertSameVariables asserts that got holds want's variables, every
// element within tol of want's, relative to its variable's largest
// magnitude (tol 0: exactly); what names the comparison.
func assertSameVariables(t *testing.T, want, got []strategy.VariableValue, tol float64, what string) {
	t.Helper()
	if !assert.NotEmpty(t, want, "%s: no variables to compare", what) {
		return
	}
	d, name, i := strategy.MaxDiff(want, got)
	assert.LessOrEqual(t, d, tol, "%s: variable %s element %d differs by %v of the variable's scale", what, name, i, d)
}

// What `make demo` runs reaches 90% held-out accuracy.
func TestDemoReachesNinetyPercent(t *testing.T) {
	var log bytes.Buffer
	res, err := classifier.Run(context.Background(), options(t, "-strategy", "mirrored", "-devices", "2"), &log)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, res.Accuracy, 0.90)
	assert.Equal(t, 2, res.Replicas)
	assert.Contains(t, log.String(), "step 300/300")
	assert.Greater(t, res.ExamplesPerSec, 0.0)
}

// The large-batch flags train together under the in-graph strategies, and
// a strategy spread over replicas ends with the model of the default one:
// in float32, every element within 1e-5 of its variable's scale. Under
// mixed_bfloat16, whose 8-bit significand rounds every product and sum to
// about 4e-3 (and the replicas' halves of a batch differently from the
// whole, in a way that depends on the CPU's bfloat16 kernels), the two
// runs drift apart over the 200 steps (an element by 0.44 of its
// variable's scale, measured on x86-64) and both reach 90%.
func TestLargeBatchFlags(t *testing.T) {
	ctx := context.Background()
	base := []string{"-steps", "200", "-global-batch", "128", "-optimizer", "lamb", "-lr", "0.02", "-warmup-steps", "10",
		"-clip-norm", "1", "-accumulate", "2", "-log-every", "0"}
	for _, policy := range []string{"float32", "mixed_bfloat16"} {
		args := append(base[:len(base):len(base)], "-mixed-precision", policy)
		want, err := classifier.Run(ctx, options(t, append(args, "-strategy", "default")...), io.Discard)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, want.Accuracy, 0.90, policy)
		got, err := classifier.Run(ctx, options(t, append(args, "-strategy", "mirrored", "-devices", "2")...), io.Discard)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, got.Accuracy, 0.90, policy)
		if policy == "float32" {
			assertSameVariables(t, want.Variables, got.Variables, 1e-5, policy)
		}
	}
}

// The accuracy is scored over the whole held-out set exactly once per
// example, each worker its share: with the same model every strategy
// reports exactly the default strategy's accuracy.
func TestAccuracyIsExactAcrossWorkers(t *testing.T) {
	ctx := context.Background()
	base := []string{"-steps", "0", "-log-every", "0", "-test-size", "301", "-global-batch", "48"}
	want, err := classifier.Run(ctx, options(t, append(base, "-strategy", "default")...), io.Discard)
	require.NoError(t, err)
	for _, extra := range [][]string{{"-strategy", "mirrored", "-devices", "3"}, {"-strategy", "multiworker", "-devices", "2"}} {
		got, err := classifier.Run(ctx, options(t, append(base, extra...)...), io.Discard)
		require.NoError(t, err, "%v", extra)
		assertSameVariables(t, want.Variables, got.Variables, 0, fmt.Sprintf("%v: the same model", extra))
		assert.Equal(t, want.Accuracy, got.Accuracy, "%v", extra)
	}
}

// The example reproduces the central equivalence end to end, through the
// dataset pipeline: same seed, same global batch, any number of replicas.
func TestStrategiesAgree(t *testing.T) {
	ctx := context.Background()
	for _, optName := range []string{"sgd", "adam"} {
		lr, tol := "0.1", 1e-4
		if optName == "adam" {
			lr, tol = "0.01", 1e-3
		}
		base := []string{"-steps", "200", "-global-batch", "32", "-optimizer", optName, "-lr", lr, "-log-every", "0"}
		want, err := classifier.Run(ctx, options(t, append(base, "-strategy", "default")...), io.Discard)
		require.NoError(t, err)
		for _, extra := range [][]string{
			{"-strategy", "mirrored", "-devices", "1"},
			{"-strategy", "mirrored", "-devices", "2"},
			{"-strategy", "mirrored", "-devices", "4"},
			{"-strategy", "multiworker", "-devices", "2"},
		} {
			got, err := classifier.Run(ctx, options(t, append(base, extra...)...), io.Discard)
			require.NoError(t, err, "%v", extra)
			assert.Less(t, testmodel.RelDiff(want.FinalLoss, got.FinalLoss), tol, "%s %v: final_loss %v vs %v", optName, extra, got.FinalLoss, want.FinalLoss)
			assertSameVariables(t, want.Variables, got.Variables, tol, fmt.Sprintf("%s %v", optName, extra))
			assert.InDelta(t, want.Accuracy, got.Accuracy, 0.01, "%s %v", optName, extra)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-devices", "0"}, "-devices 0"},
		{[]string{"-global-batch", "0"}, "-global-batch 0"},
		{[]string{"-test-size", "5000"}, "-test-size 5000"},
		{[]string{"-accumulate", "0"}, "-accumulate 0"},
		{[]string{"-accumulate", "4", "-steps", "10"}, "-steps 10: expected a multiple of -accumulate 4"},
		{[]string{"-warmup-steps", "500", "-steps", "300"}, "-warmup-steps 500"},
		{[]string{"-clip-norm", "-1"}, "-clip-norm -1"},
		{[]string{"-lr", "NaN"}, "-lr NaN"},
		{[]string{"-mixed-precision", "mixed_int8"}, `"mixed_int8"`},
		{[]string{"-dp-clip", "-1"}, "-dp-clip -1: expected a positive norm"},
		{[]string{"-dp-clip", "1", "-dp-noise", "-2"}, "-dp-noise -2: expected a finite noise multiplier >= 0"},
		{[]string{"-dp-clip", "1", "-dp-delta", "2"}, "-dp-delta 2: expected a value in (0, 1)"},
		{[]string{"-dp-clip", "1", "-strategy", "ps"}, "the parameter-server strategy's workers update asynchronously"},
		{[]string{"-dp-clip", "1", "-clip-norm", "1"}, "DP-SGD clips each example; drop -clip-norm"},
		{[]string{"-export-dir", "m", "-export-version", "-2"}, "-export-version -2: expected a positive version, 0 for none or -1 for the next"},
		{[]string{"-export-version", "3"}, "-export-version 3: expected -export-dir too"},
	} {
		_, err := classifier.ParseFlags(c.args, io.Discard)
		assert.ErrorContains(t, err, c.want)
	}
	ctx := context.Background()
	_, err := classifier.Run(ctx, options(t, "-strategy", "nope"), io.Discard)
	assert.ErrorContains(t, err, `-strategy "nope"`)
	_, err = classifier.Run(ctx, options(t, "-optimizer", "nope"), io.Discard)
	assert.ErrorContains(t, err, `-optimizer "nope"`)
	_, err = classifier.Run(ctx, options(t, "-strategy", "mirrored", "-devices", "3", "-global-batch", "64"), io.Discard)
	assert.ErrorContains(t, err, "does not divide")
	_, err = classifier.Run(ctx, options(t, "-strategy", "default", "-devices", "2"), io.Discard)
	assert.ErrorContains(t, err, "use -strategy mirrored")
	o := options(t, "-strategy", "default")
	o.Faults.CrashAtStep = -1
	_, err = classifier.Run(ctx, o, io.Discard)
	assert.ErrorContains(t, err, "Faults.CrashAtStep -1: expected a step of at least 1, or 0 for none")
}

// Under -dp-clip the classifier trains with DP-SGD on Poisson samples:
// the privacy it reports is the accountant's for its rate, noise and
// steps, shown in the progress lines too; the noise -dp-epsilon chooses
// stays within it; a run that would exceed its target refuses to start;
// and Mirrored on 2 devices trains the default strategy's model.
func TestDifferentialPrivacy(t *testing.T) {
	ctx := context.Background()
	base := []string{"-dp-clip", "1", "-dp-noise", "1.1", "-steps", "20", "-log-every", "10", "-global-batch", "16"}
	var log bytes.Buffer
	want, err := classifier.Run(ctx, options(t, append(base, "-strategy", "default")...), &log)
	require.NoError(t, err)
	eps, _, err := accountant.Epsilon(16.0/float64(digits.Examples-297), 1.1, 20, 1e-5)
	require.NoError(t, err)
	assert.Equal(t, eps, want.Epsilon)
	assert.Equal(t, 1e-5, want.Delta)
	assert.Regexp(t, `step 20/20  loss [\d.]+  ε [\d.]+ `, log.String())
	got, err := classifier.Run(ctx, options(t, append(base, "-strategy", "mirrored", "-devices", "2", "-log-every", "0")...), io.Discard)
	require.NoError(t, err)
	assertSameVariables(t, want.Variables, got.Variables, 1e-5, "mirrored on 2 devices")

	target, err := classifier.Run(ctx, options(t, "-dp-clip", "1", "-dp-epsilon", "2", "-steps", "20", "-log-every", "0", "-global-batch", "16"), io.Discard)
	require.NoError(t, err)
	assert.LessOrEqual(t, target.Epsilon, 2.0)
	assert.Greater(t, target.Epsilon, 1.99)
	_, err = classifier.Run(ctx, options(t, append(base, "-dp-epsilon", "0.3")...), io.Discard)
	assert.ErrorContains(t, err, "-steps 20 with -dp-noise 1.1 spend epsilon")
	assert.ErrorContains(t, err, "more than -dp-epsilon 0.3 allows")
}

// Faults are injected by the tests alone: no flag takes them, the usage
// text does not mention them, and neither shipped program (digits,
// tfdist) holds the name of the test-only program's variable, or any
// TFDIST_TEST_ variable.
func TestNoFaultInjectionInShippedPrograms(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, classifier.Main("classifier", "mlp", []string{"-h"}, &stdout, &stderr))
	usage := stderr.String()
	assert.Contains(t, usage, "-checkpoint-dir")
	assert.NotContains(t, usage, "crash")
	assert.NotContains(t, usage, "TFDIST_TEST")
	_, err := classifier.ParseFlags([]string{"-crash-at-step", "5"}, io.Discard)
	assert.ErrorContains(t, err, "flag provided but not defined: -crash-at-step")

	needBinaries(t)
	for _, bin := range []string{bins.digits, bins.tfdist, bins.faulty} {
		b, err := os.ReadFile(bin)
		require.NoError(t, err)
		if bin == bins.faulty {
			assert.Contains(t, string(b), faultsEnv, "the test-only program reads it")
			continue
		}
		assert.NotContains(t, string(b), "TFDIST_TEST_", bin)
	}
}

// tfdist's DP-SGD reaches, on the held-out digits, within 3 points of the
// same algorithm written in Python TensorFlow (per-example gradients by
// vectorized_map, Poisson sampling) at the same settings, each the mean
// over the same 3 seeds and data splits.
func TestDPSGDMatchesPythonTensorFlow(t *testing.T) {
	const steps, batch, hidden, clip, noise, lr = 200, 64, 64, 1.0, 1.4, 0.5
	seeds := []uint64{1, 2, 3}
	data, err := digits.Load()
	require.NoError(t, err)
	var splits []map[string]any
	var goAcc float64
	for _, seed := range seeds {
		train, test := data.Split(297, seed)
		splits = append(splits, map[string]any{"x_train": train.X, "y_train": train.Y, "x_test": test.X, "y_test": test.Y})
		res, err := classifier.Run(context.Background(), options(t, "-dp-clip", fmt.Sprint(clip), "-dp-noise", fmt.Sprint(noise),
			"-lr", fmt.Sprint(lr), "-steps", fmt.Sprint(steps), "-global-batch", fmt.Sprint(batch), "-hidden", fmt.Sprint(hidden),
			"-seed", fmt.Sprint(seed), "-log-every", "0"), io.Discard)
		require.NoError(t, err)
		goAcc += res.Accuracy / float64(len(seeds))
	}
	var py struct{ Accuracy []float64 }
	pyenv.TensorFlow(t).JSON(t, "testdata/dpsgd_reference.py", map[string]any{"steps": steps, "global_batch": batch,
		"hidden": hidden, "clip": clip, "noise": noise, "lr": lr, "seeds": seeds, "splits": splits}, &py)
	require.Len(t, py.Accuracy, len(seeds))
	var pyAcc float64
	for _, a := range py.Accuracy {
		pyAcc += a / float64(len(seeds))
	}
	t.Logf("held-out accuracy, mean of %d seeds: tfdist %.4f, Python TensorFlow %.4f", len(seeds), goAcc, pyAcc)
	assert.InDelta(t, pyAcc, goAcc, 0.03)
}

// A DP-SGD run resumed from its checkpoint ends with the model of an
// uninterrupted run: the same Poisson batches, and the noise stream goes
// on from the step count the checkpoint holds.
func TestDPSGDResumesItsNoiseStream(t *testing.T) {
	ctx := context.Background()
	base := []string{"-dp-clip", "1", "-dp-noise", "1.1", "-global-batch", "16", "-log-every", "0", "-checkpoint-every", "10"}
	want, err := classifier.Run(ctx, options(t, append(base, "-steps", "30")...), io.Discard)
	require.NoError(t, err)
	dir := t.TempDir()
	_, err = classifier.Run(ctx, options(t, append(base, "-steps", "20", "-checkpoint-dir", dir)...), io.Discard)
	require.NoError(t, err)
	var log bytes.Buffer
	got, err := classifier.Run(ctx, options(t, append(base, "-steps", "30", "-checkpoint-dir", dir)...), &log)
	require.NoError(t, err)
	assert.Contains(t, log.String(), "resuming after step 20")
	assertSameVariables(t, want.Variables, got.Variables, 0, "the resumed run's model")
	assert.Equal(t, want.Epsilon, got.Epsilon)
}
