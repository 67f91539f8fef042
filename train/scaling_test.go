package train_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// labelCount is a metric that counts an epoch's examples of label c.
type labelCount int32

func (c labelCount) Name() string { return fmt.Sprintf("label_%d", c) }

func (c labelCount) Sums(s *op.Scope, yTrue, _, weight tf.Output) ([]tf.Output, error) {
	is := op.Cast(s.SubScope("is"), op.Equal(s.SubScope("eq"), yTrue, op.Const(s.SubScope("c"), int32(c))), tf.Float)
	n := op.Sum(s.SubScope("n"), op.Mul(s.SubScope("weighted"), is, weight), op.Const(s.SubScope("axis"), int32(0)))
	return []tf.Output{n}, s.Err()
}

func (labelCount) Result(totals []float64) float64 { return totals[0] }

// labelCounts counts each label of the digits in an epoch.
func labelCounts() []train.Metric {
	ms := make([]train.Metric, digits.Classes)
	for c := range ms {
		ms[c] = labelCount(c)
	}
	return ms
}

// processLabelCounts returns how many of processExamples have each label.
func processLabelCounts(t testing.TB) []float64 {
	t.Helper()
	d, err := digits.Load()
	require.NoError(t, err)
	n := make([]float64, digits.Classes)
	for _, y := range d.Y[:300] {
		n[y]++
	}
	return n
}

// fitExamples fits mlp, compiled on s at an Adjustable lr, for epochs on
// ds, and returns its model, its History and the rate it ended at.
func fitExamples(t *testing.T, s strategy.Strategy, lr float32, ds dataset.Dataset, opts ...train.FitOption) ([]strategy.VariableValue, *train.History, float64) {
	t.Helper()
	ctx := context.Background()
	tr := adjustable(t, s, lr)
	h, err := tr.Fit(ctx, ds, append(opts, train.Epochs(2))...)
	require.NoError(t, err)
	rate, err := tr.LearningRate(ctx)
	require.NoError(t, err)
	return readModel(t, s), h, rate
}

// Fit with PerReplicaBatch(16) at a rate of 0.05 on mirrored x2 trains the
// model one device trains on the same examples in batches of 32 at 0.1,
// the partial last batch of each epoch included, to 1e-5, and leaves the
// rate at 0.1; on one device it trains the model of batches of 16 at
// 0.05, bit for bit.
func TestPerReplicaBatchFollowsTheLinearScalingRule(t *testing.T) {
	d, _ := digitsData(t)
	examples := func() dataset.Dataset { return dataset.Shuffle(sliceDS(t, d, 300), 300, 11) }
	one := func() strategy.Strategy {
		s, err := onedevice.New()
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	mir, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer mir.Close()

	got, gotH, rate := fitExamples(t, mir, 0.05, examples(), train.PerReplicaBatch(16))
	want, wantH, _ := fitExamples(t, one(), 0.1, dataset.Batched(examples(), 32, false))
	diff, name, i := strategy.MaxDiff(want, got)
	assert.Less(t, diff, 1e-5, "mirrored x2: %s[%d]", name, i)
	assert.InDeltaSlice(t, wantH.Values["loss"], gotH.Values["loss"], 1e-5, "mirrored x2: loss")
	assert.InDelta(t, 0.1, rate, 1e-8, "mirrored x2: the rate after Fit")

	got, _, rate = fitExamples(t, one(), 0.05, examples(), train.PerReplicaBatch(16))
	want, _, _ = fitExamples(t, one(), 0.05, dataset.Batched(examples(), 16, false))
	diff, name, i = strategy.MaxDiff(want, got)
	assert.Zero(t, diff, "one device: %s[%d]", name, i)
	assert.InDelta(t, 0.05, rate, 1e-8, "one device: the rate after Fit")
}

// failAt fails Fit after step at.
type failAt struct {
	train.BaseCallback
	at int64
}

var errFailAt = errors.New("failed on purpose")

func (f failAt) OnBatchEnd(_ context.Context, r *train.Run, _ int, _ train.Logs) error {
	if r.Steps() == f.at {
		return errFailAt
	}
	return nil
}

// A Fit with PerReplicaBatch(8) and BackupAndRestore on mirrored x2 (a
// global batch of 16) that fails in its second epoch resumes in examples:
// on mirrored x2 it ends with the model of the Fit never interrupted; on
// one device (a global batch of 8) it trains every example of every epoch
// once (each epoch counts every label as often as the data has it) and
// goes on at the rate of one replica.
func TestPerReplicaBatchResumesOnOtherReplicas(t *testing.T) {
	ctx := context.Background()
	fit := func(s strategy.Strategy, cbs ...train.Callback) (*train.History, float64, error) {
		ds, err := processExamples()
		require.NoError(t, err)
		tr, err := compileMLP(s, optimizer.NewAdjustable(0.05), labelCounts()...)
		require.NoError(t, err)
		h, err := tr.Fit(ctx, ds, train.Epochs(3), train.PerReplicaBatch(8), train.WithCallbacks(cbs...))
		if err != nil {
			return h, 0, err
		}
		rate, err := tr.LearningRate(ctx)
		require.NoError(t, err)
		return h, rate, nil
	}
	mirroredX2 := func() strategy.Strategy {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := mirroredX2()
	_, _, err := fit(s)
	require.NoError(t, err)
	want := readModel(t, s)

	dir := t.TempDir()
	_, _, err = fit(mirroredX2(), &train.BackupAndRestore{Dir: dir, SaveFreq: 5}, failAt{at: 25}) // 19 steps an epoch
	require.ErrorIs(t, err, errFailAt)
	again := t.TempDir()
	require.NoError(t, os.CopyFS(again, os.DirFS(dir)))

	s = mirroredX2()
	_, rate, err := fit(s, &train.BackupAndRestore{Dir: again})
	require.NoError(t, err)
	diff, name, i := strategy.MaxDiff(want, readModel(t, s))
	assert.Less(t, diff, 1e-6, "resumed on mirrored x2: %s[%d]", name, i)
	assert.InDelta(t, 0.1, rate, 1e-8, "the rate of two replicas")

	one, err := onedevice.New()
	require.NoError(t, err)
	defer one.Close()
	h, rate, err := fit(one, &train.BackupAndRestore{Dir: dir})
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, h.Epochs)
	for c, n := range processLabelCounts(t) {
		key := labelCount(c).Name()
		assert.Equal(t, []float64{n, n}, h.Values[key], "%s in every epoch", key)
	}
	assert.InDelta(t, 0.05, rate, 1e-8, "the rate of one replica")
}

// PerReplicaBatch refuses what it cannot do, before the first step, naming
// the option, its value and what it expected.
func TestPerReplicaBatchRefusals(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := adjustable(t, s, 0.05)
	s2, err := onedevice.New()
	require.NoError(t, err)
	defer s2.Close()
	examples := sliceDS(t, d, 64)
	ps := adjustable(t, newPS(t), 0.05)
	defer ps.Close()
	for _, c := range []struct {
		name string
		tr   *train.Trainer
		ds   dataset.Dataset
		opts []train.FitOption
		want []string
	}{
		{"no example", tr, examples, []train.FitOption{train.PerReplicaBatch(0)}, []string{"PerReplicaBatch(0)", "at least 1"}},
		{"negative", tr, examples, []train.FitOption{train.PerReplicaBatch(-3)}, []string{"PerReplicaBatch(-3)", "at least 1"}},
		{"steps per epoch", tr, examples, []train.FitOption{train.PerReplicaBatch(8), train.StepsPerEpoch(5)},
			[]string{"PerReplicaBatch(8) with StepsPerEpoch(5)"}},
		{"batched data", tr, dataset.Batched(examples, 32, false), []train.FitOption{train.PerReplicaBatch(8)},
			[]string{"PerReplicaBatch(8)", `"x" is of shape [32 64]`, "[64]", "single examples"}},
		{"constant rate", compiled(t, s2), examples, []train.FitOption{train.PerReplicaBatch(8)},
			[]string{"PerReplicaBatch(8)", "optimizer.NewAdjustable", "Constant"}},
		{"parameter servers", ps, examples, []train.FitOption{train.PerReplicaBatch(8)},
			[]string{"PerReplicaBatch(8) under the parameter-server strategy"}},
	} {
		_, err := c.tr.Fit(ctx, c.ds, c.opts...)
		require.Error(t, err, c.name)
		for _, w := range c.want {
			assert.ErrorContains(t, err, w, c.name)
		}
	}
}
