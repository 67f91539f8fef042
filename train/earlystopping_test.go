package train_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// On a validation loss that falls and then rises, EarlyStopping stops at
// the first epoch Patience epochs after the best so far, and
// RestoreBestWeights leaves the best epoch's model: evaluated after Fit,
// it scores that epoch's val_loss, on one device and on two replicas.
func TestEarlyStoppingRestoresBestEpoch(t *testing.T) {
	strategies := map[string]func() (strategy.Strategy, error){
		"default":     func() (strategy.Strategy, error) { return onedevice.New() },
		"mirrored x2": func() (strategy.Strategy, error) { return mirrored.New(mirrored.WithLogicalCPUs(2)) },
	}
	for name, newStrategy := range strategies {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, err := newStrategy()
			require.NoError(t, err)
			defer s.Close()
			tr := compiledLR(t, s, 0.3)
			ds, val := overfitting(t)
			const patience, epochs = 2, 20
			es := &train.EarlyStopping{Patience: patience, RestoreBestWeights: true}
			h, err := tr.Fit(ctx, ds, train.Epochs(epochs), train.ValidationData(val), train.WithCallbacks(es))
			require.NoError(t, err)

			// The first epoch at which the best so far is patience epochs old.
			vl := h.Values["val_loss"]
			stop := -1
			for e := range vl {
				if e-argmin(vl[:e+1]) == patience {
					stop = e
					break
				}
			}
			require.NotEqual(t, -1, stop, "the validation loss %v never rose for %d epochs", vl, patience)
			best := argmin(vl)
			t.Logf("val_loss %.4f: best epoch %d, stopped after epoch %d", vl, best, stop)
			assert.Equal(t, stop, h.Epochs[len(h.Epochs)-1], "the last epoch trained")
			assert.Equal(t, stop, es.StoppedEpoch())
			assert.Equal(t, best, es.BestEpoch())
			require.Positive(t, best, "a best epoch after the first")
			require.Greater(t, vl[stop]-vl[best], 1e-3, "the last epoch's model scores worse than the best")

			logs, err := tr.Evaluate(ctx, val, 0)
			require.NoError(t, err)
			assert.InDelta(t, vl[best], logs["loss"], 1e-6, "the restored model scores the best epoch's val_loss")
			assert.InDelta(t, h.Values["val_accuracy"][best], logs["accuracy"], 1e-6)
		})
	}
}

// What would silently disable EarlyStopping fails Fit instead: a Monitor
// the logs lack, at the first epoch's end, naming the keys there are; a
// validation Monitor when no epoch validated, at the end; an unknown
// Mode, before training. A validation Monitor is skipped at epochs that
// do not validate.
func TestEarlyStoppingRefusesWhatWouldDisableIt(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)

	h, err := tr.Fit(ctx, ds, train.Epochs(3), train.ValidationData(val),
		train.WithCallbacks(&train.EarlyStopping{Monitor: "val_los"}))
	require.ErrorContains(t, err, `epoch 0: callback EarlyStopping: OnEpochEnd: no Monitor "val_los" in the logs of epoch 0, which have accuracy, loss, val_accuracy, val_loss`)
	assert.Empty(t, h.Epochs)

	h, err = tr.Fit(ctx, ds, train.Epochs(2), train.WithCallbacks(&train.EarlyStopping{}))
	require.ErrorContains(t, err, `callback EarlyStopping: OnTrainBegin: the Monitor "val_loss" is a validation log, and Fit has no ValidationData`)
	assert.Empty(t, h.Epochs, "refused before the first step")

	_, err = tr.Fit(ctx, ds, train.Epochs(2), train.WithCallbacks(&train.EarlyStopping{Mode: "maximum"}))
	require.ErrorContains(t, err, `callback EarlyStopping: OnTrainBegin: unknown Mode "maximum", expected "auto", "min" or "max"`)

	es := &train.EarlyStopping{Monitor: "val_accuracy", Patience: 5}
	h, err = tr.Fit(ctx, ds, train.Epochs(4), train.ValidationData(val), train.ValidationFreq(2), train.WithCallbacks(es))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 3}, h.Epochs)
	assert.Equal(t, -1, es.StoppedEpoch())
	assert.Contains(t, []int{1, 3}, es.BestEpoch(), "a validating epoch")
}

// RestoreBestWeights needs a strategy that assigns variables outside a
// replica: under parameter servers Fit fails before the first step,
// naming the strategy.
func TestEarlyStoppingRestoreNeedsAssign(t *testing.T) {
	ctx := context.Background()
	s := newPS(t)
	tr := compiled(t, s)
	defer tr.Close()
	ds, val := overfitting(t)
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.StepsPerEpoch(3), train.ValidationData(val),
		train.WithCallbacks(&train.EarlyStopping{RestoreBestWeights: true}))
	require.ErrorContains(t, err, "callback EarlyStopping: OnTrainBegin: RestoreBestWeights: the strategy *paramserver.Strategy cannot assign variables outside a replica")
	assert.Empty(t, h.Epochs)
}
