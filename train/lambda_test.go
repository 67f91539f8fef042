package train_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/train"
)

// A LambdaCallback's functions are called as Keras calls the hooks:
// training, then each epoch, each batch from 0 in each epoch, with the
// epoch's logs at its end; unset functions are skipped.
func TestLambdaCallbackCallsItsFunctions(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	var calls []string
	var epochLogs []train.Logs
	add := func(format string, args ...any) { calls = append(calls, fmt.Sprintf(format, args...)) }
	l := &train.LambdaCallback{
		TrainBegin: func(context.Context, *train.Run) error { add("train begin"); return nil },
		EpochBegin: func(_ context.Context, r *train.Run, epoch int) error {
			add("epoch %d begin (Run.Epoch %d)", epoch, r.Epoch())
			return nil
		},
		BatchBegin: func(_ context.Context, _ *train.Run, batch int) error { add("batch %d begin", batch); return nil },
		BatchEnd: func(_ context.Context, r *train.Run, batch int, _ train.Logs) error {
			add("batch %d end, %d steps", batch, r.Steps())
			return nil
		},
		EpochEnd: func(_ context.Context, _ *train.Run, epoch int, logs train.Logs) error {
			add("epoch %d end", epoch)
			epochLogs = append(epochLogs, logs)
			return nil
		},
		TrainEnd: func(context.Context, *train.Run, train.Logs) error { add("train end"); return nil },
	}
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.StepsPerEpoch(2), train.ValidationData(val),
		train.WithCallbacks(l, &train.LambdaCallback{}))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"train begin",
		"epoch 0 begin (Run.Epoch 0)", "batch 0 begin", "batch 0 end, 1 steps", "batch 1 begin", "batch 1 end, 2 steps", "epoch 0 end",
		"epoch 1 begin (Run.Epoch 1)", "batch 0 begin", "batch 0 end, 3 steps", "batch 1 begin", "batch 1 end, 4 steps", "epoch 1 end",
		"train end",
	}, calls)
	require.Len(t, epochLogs, 2)
	for e, logs := range epochLogs {
		for k, v := range h.Values {
			assert.Equal(t, v[e], logs[k], "epoch %d: %s", e, k)
		}
	}
}
