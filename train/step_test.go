package train_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// A custom training step written with the StepContext's pieces trains
// exactly the model of the compiled step, and its loss and predictions
// are what Fit logs.
func TestCustomTrainStep(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	fit := func(opts ...train.Option) ([]strategy.VariableValue, *train.History) {
		s, err := onedevice.New()
		require.NoError(t, err)
		defer s.Close()
		tr := compiled(t, s, opts...)
		h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(2))
		require.NoError(t, err)
		return readModel(t, s), h
	}
	want, wantH := fit()
	calls := 0
	got, h := fit(train.WithTrainStep(func(r strategy.Replica, in strategy.Inputs, c *train.StepContext) (loss, yPred tf.Output, err error) {
		calls++
		if yPred, err = c.Predict(r, true); err != nil {
			return
		}
		if loss, err = c.Loss(r, yPred); err != nil {
			return
		}
		return loss, yPred, c.Minimize(r, loss)
	}))
	assert.Equal(t, 1, calls, "traced once, for the one replica")
	assert.Equal(t, want, got)
	assert.Equal(t, wantH.Values, h.Values)

	// A step that does not minimize leaves the model as it was, and its
	// logs are the untrained model's.
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s, train.WithTrainStep(func(r strategy.Replica, in strategy.Inputs, c *train.StepContext) (loss, yPred tf.Output, err error) {
		if yPred, err = c.Predict(r, true); err != nil {
			return
		}
		loss, err = c.Loss(r, yPred)
		return
	}))
	before := readModel(t, s)
	h, err = tr.Fit(ctx, shuffled(t, d), train.Epochs(2))
	require.NoError(t, err)
	assert.Equal(t, before, readModel(t, s))
	logs, err := tr.Evaluate(ctx, shuffled(t, d), 0)
	require.NoError(t, err)
	assert.InDelta(t, logs["loss"], h.Values["loss"][1], 1e-6)
}
