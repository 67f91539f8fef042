package train_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/train"
)

// failing is a callback that fails, or panics, at the end of an epoch.
type failing struct {
	train.BaseCallback
	panics bool
}

func (f failing) Name() string { return "failing" }

func (f failing) OnEpochEnd(context.Context, *train.Run, int, train.Logs) error {
	if f.panics {
		panic("out of cheese")
	}
	return errors.New("no more epochs")
}

// Bad input to Fit, Evaluate and Predict is an error naming what it was
// given and what was expected, before the first step.
func TestFitRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	good := dataset.Batched(sliceDS(t, d, 64), 32, false)
	wide, err := dataset.FromSlices(map[string]any{"x": make([][]float32, 8), "y": d.Y[:8]})
	require.NoError(t, err)
	xOnly, err := dataset.FromSlices(map[string]any{"x": d.X[:8]})
	require.NoError(t, err)
	floatY, err := dataset.FromSlices(map[string]any{"x": d.X[:8], "y": make([]float32, 8)})
	require.NoError(t, err)
	matrixY, err := dataset.FromSlices(map[string]any{"x": d.X[:8], "y": make([][]int32, 8)})
	require.NoError(t, err)

	for name, c := range map[string]struct {
		err  func() error
		want []string
	}{
		"zero epochs":       {func() error { _, err := tr.Fit(ctx, good, train.Epochs(0)); return err }, []string{"Epochs(0)", "at least 1"}},
		"negative steps":    {func() error { _, err := tr.Fit(ctx, good, train.StepsPerEpoch(-1)); return err }, []string{"StepsPerEpoch(-1)"}},
		"initial epoch":     {func() error { _, err := tr.Fit(ctx, good, train.Epochs(2), train.InitialEpoch(2)); return err }, []string{"InitialEpoch(2)", "0 to Epochs-1 = 1"}},
		"wrong input shape": {func() error { _, err := tr.Fit(ctx, dataset.Batched(wide, 4, false), train.Epochs(1)); return err }, []string{`"x"`, "[4 0]", "[? 64]", "input input_0"}},
		"no labels":         {func() error { _, err := tr.Fit(ctx, dataset.Batched(xOnly, 4, false)); return err }, []string{`no labels "y"`, "[x]"}},
		"validation unlabeled": {func() error {
			_, err := tr.Fit(ctx, good, train.ValidationData(dataset.Batched(xOnly, 4, false)))
			return err
		}, []string{"validation data", `no labels "y"`}},
		"float labels":        {func() error { _, err := tr.Fit(ctx, dataset.Batched(floatY, 4, false)); return err }, []string{"sparse_categorical_crossentropy", "float32", "integer class ids"}},
		"label shape":         {func() error { _, err := tr.Evaluate(ctx, dataset.Batched(matrixY, 4, false), 0); return err }, []string{"sparse_categorical_crossentropy", "labels of shape", "expected labels of shape [?]"}},
		"failing callback":    {func() error { _, err := tr.Fit(ctx, good, train.WithCallbacks(failing{})); return err }, []string{"callback failing", "OnEpochEnd", "no more epochs"}},
		"panicking callback":  {func() error { _, err := tr.Fit(ctx, good, train.WithCallbacks(failing{panics: true})); return err }, []string{"callback failing", "panic: out of cheese"}},
		"nil callback":        {func() error { _, err := tr.Fit(ctx, good, train.WithCallbacks(nil)); return err }, []string{"callback 0 is nil"}},
		"negative eval steps": {func() error { _, err := tr.Evaluate(ctx, good, -1); return err }, []string{"steps -1"}},
		"empty data":          {func() error { _, err := tr.Fit(ctx, dataset.Take(good, 0)); return err }, []string{"no element"}},
	} {
		err := c.err()
		require.Error(t, err, name)
		for _, w := range c.want {
			assert.Contains(t, err.Error(), w, name)
		}
	}
}

// A metric that does not apply to the model's output, or two metrics of
// one name, are errors naming the metric, before the first step.
func TestCompileRefusesBadMetrics(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s, train.WithMetrics(train.NamedMetric("binary", train.BinaryAccuracy{})))
	_, err = tr.Fit(ctx, dataset.Batched(sliceDS(t, d, 8), 4, false))
	require.ErrorContains(t, err, "metric binary: labels of shape [?] and predictions of shape [? 10]")

	_, err = train.Compile(s, tr.Model(), train.MeanSquaredError{}, optimizer.NewSGD(nil),
		train.WithMetrics(train.SparseCategoricalAccuracy{}, train.CategoricalAccuracy{}))
	require.ErrorContains(t, err, `metric 1 named "accuracy"`)
}
