package train_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// Fit of a step that accumulates the gradients of 2 batches of 32
// (strategy.WithAccumulation) trains the model Fit trains on batches of
// 64 of the same examples, in the same order: on one device, and on 2
// workers at both stages of sharded optimizer state. Its History is the
// same: the step that applies an update logs the batches it accumulated,
// and the steps between log nothing.
func TestFitAccumulates(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	batches := func(n int) dataset.Dataset { return dataset.Batched(sliceDS(t, d, 256), n, true) }
	accumulate := train.WithMinimizeOptions(strategy.WithAccumulation(2))
	fit := func(s strategy.Strategy, batch int, opts ...train.Option) ([]strategy.VariableValue, *train.History) {
		tr := compiled(t, s, opts...)
		h, err := tr.Fit(ctx, batches(batch), train.Epochs(2))
		require.NoError(t, err)
		return modelValues(t, s, tr), h
	}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want, wantH := fit(def, 64)
	acc, err := onedevice.New()
	require.NoError(t, err)
	defer acc.Close()
	got, h := fit(acc, 32, accumulate)
	requireClose(t, want, got, "one device")
	for _, name := range []string{"loss", "accuracy"} {
		assert.InDeltaSlice(t, wantH.Values[name], h.Values[name], 1e-6, name)
	}

	for _, stage := range []int{1, 2} {
		vals := make([][]strategy.VariableValue, 2)
		errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithZeRO(stage),
			multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
			func(w int, s *multiworker.Strategy) error {
				vals[w], _ = fit(s, 32, accumulate)
				return nil
			})
		for w := range 2 {
			require.NoError(t, errs[w], "worker %d", w)
			requireClose(t, want, vals[w], "ZeRO stage", stage, "worker", w)
		}
	}
}

// modelValues reads the values of tr's model's variables on s.
func modelValues(t testing.TB, s strategy.ValueReader, tr *train.Trainer) []strategy.VariableValue {
	t.Helper()
	vals, err := strategy.ReadVariables(context.Background(), s, tr.Model().Variables())
	require.NoError(t, err)
	return vals
}

// requireClose fails unless got holds want's variables within 1e-5 of
// each one's scale (strategy.MaxDiff).
func requireClose(t *testing.T, want, got []strategy.VariableValue, what ...any) {
	t.Helper()
	require.True(t, slices.EqualFunc(want, got, func(a, b strategy.VariableValue) bool { return a.Name == b.Name }), what...)
	diff, name, i := strategy.MaxDiff(want, got)
	require.Less(t, diff, 1e-5, "%v: %s[%d]", what, name, i)
}
