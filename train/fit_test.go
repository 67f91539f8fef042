package train_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// digitsData returns the digits as a dataset of x and y, and a held-out
// part.
func digitsData(t testing.TB) (trainSet, heldOut digits.Data) {
	t.Helper()
	d, err := digits.Load()
	require.NoError(t, err)
	return d.Split(297, 7)
}

func sliceDS(t testing.TB, d digits.Data, n int) dataset.Dataset {
	t.Helper()
	ds, err := dataset.FromSlices(map[string]any{"x": d.X[:n], "y": d.Y[:n]})
	require.NoError(t, err)
	return ds
}

// mlp is a functional MLP on the digits.
func mlp(t testing.TB, sc strategy.Scope) *nn.Model {
	t.Helper()
	in := nn.Input(64)
	h := nn.Dense{Units: 32, Activation: nn.ReLU}.Call(in)
	m, err := nn.NewModel(sc, "mlp", []*nn.Tensor{in}, []*nn.Tensor{nn.Dense{Units: 10}.Call(h)}, nn.WithSeed(5))
	require.NoError(t, err)
	return m
}

// compiled compiles mlp on s with SGD with momentum 0.9 at 0.05.
func compiled(t testing.TB, s train.Strategy, opts ...train.Option) *train.Trainer {
	t.Helper()
	return compiledLR(t, s, 0.05, opts...)
}

func compiledLR(t testing.TB, s train.Strategy, lr float32, opts ...train.Option) *train.Trainer {
	t.Helper()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) error { m = mlp(t, sc); return nil }))
	opts = append([]train.Option{train.WithMetrics(train.SparseCategoricalAccuracy{})}, opts...)
	tr, err := train.Compile(s, m, train.SparseCategoricalCrossentropy{FromLogits: true},
		optimizer.NewKerasMomentum(optimizer.Constant(lr), 0.9, false), opts...)
	require.NoError(t, err)
	return tr
}

// shuffled is 300 examples in batches of 64 (the last one partial),
// reshuffled every epoch.
func shuffled(t testing.TB, d digits.Data) dataset.Dataset {
	return dataset.Batched(dataset.Shuffle(sliceDS(t, d, 300), 300, 11), 64, false)
}

// readModel reads the float32 variables of s: the model's and the
// optimizer's slots.
func readModel(t testing.TB, s strategy.Strategy) []strategy.VariableValue {
	t.Helper()
	var vs []strategy.Variable
	for _, v := range s.Variables() {
		if v.DType() == tf.Float {
			vs = append(vs, v)
		}
	}
	vals, err := strategy.ReadVariables(context.Background(), s, vs)
	require.NoError(t, err)
	return vals
}

// Fit under the default strategy ends with the model a hand-written loop
// of the same steps ends with, bit for bit, and its History holds each
// epoch's mean loss over the examples and accuracy.
func TestFitEqualsHandWrittenLoop(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)

	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(3))
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2}, h.Epochs)
	require.Len(t, h.Values["loss"], 3)
	assert.Less(t, h.Values["loss"][2], h.Values["loss"][0])
	assert.Greater(t, h.Values["accuracy"][2], h.Values["accuracy"][0])
	got := readModel(t, s)

	ref, err := onedevice.New()
	require.NoError(t, err)
	defer ref.Close()
	var m *nn.Model
	require.NoError(t, ref.Scope(func(sc strategy.Scope) error { m = mlp(t, sc); return nil }))
	opt := optimizer.NewKerasMomentum(optimizer.Constant(0.05), 0.9, false)
	step, err := ref.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 64}}, "y": {DType: tf.Int32, Shape: []int64{-1}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"], true)
			if err != nil {
				return nil, err
			}
			loss := r.AverageLoss(nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("xent"), logits, in["y"], 10))
			return nil, r.Minimize(opt, loss, m.Vars())
		})
	require.NoError(t, err)
	dist, err := ref.DistributeDataset(shuffled(t, d))
	require.NoError(t, err)
	for range 3 {
		for b, err := range dist.All(ctx) {
			require.NoError(t, err)
			_, err = ref.Run(ctx, step, b)
			require.NoError(t, err)
		}
	}
	want := readModel(t, ref)
	require.Equal(t, len(want), len(got))
	for i := range want {
		assert.Equal(t, want[i], got[i], want[i].Name)
	}
}

// Fit under mirrored x2 and two workers of two devices ends with the
// default strategy's model, element by element within 1e-4, and reports
// the same History.
func TestFitReplicasMatchOneDevice(t *testing.T) {
	ctx := context.Background()
	d, held := digitsData(t)
	val := dataset.Batched(sliceDS(t, held, 100), 32, false)
	fit := func(s strategy.Strategy) ([]strategy.VariableValue, *train.History, train.Logs) {
		tr := compiled(t, s)
		h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(2), train.ValidationData(val))
		require.NoError(t, err)
		logs, err := tr.Evaluate(ctx, val, 0)
		require.NoError(t, err)
		return readModel(t, s), h, logs
	}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want, wantH, wantLogs := fit(def)
	assert.InDelta(t, wantH.Values["val_loss"][1], wantLogs["loss"], 1e-12, "the last validation is an evaluation")

	check := func(what string, got []strategy.VariableValue, h *train.History, logs train.Logs) {
		diff, name, i := strategy.MaxDiff(want, got)
		assert.Less(t, diff, 1e-4, "%s: %s[%d]", what, name, i)
		for k, v := range wantH.Values {
			assert.InDeltaSlice(t, v, h.Values[k], 1e-4, "%s: %s", what, k)
		}
		assert.InDelta(t, wantLogs["accuracy"], logs["accuracy"], 1e-9, what)
	}
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	got, h, logs := fit(s)
	check("mirrored x2", got, h, logs)
	require.NoError(t, s.Close())

	type out struct {
		vals []strategy.VariableValue
		h    *train.History
		logs train.Logs
	}
	outs := make([]out, 2)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			v, h, l := fit(s)
			outs[w] = out{v, h, l}
			return nil
		})
	for w := range 2 {
		require.NoError(t, errs[w])
		check("worker of 2x2", outs[w].vals, outs[w].h, outs[w].logs)
	}
}
