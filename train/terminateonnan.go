package train

import (
	"context"
	"math"
)

// TerminateOnNaN stops training at the end of the first batch whose loss
// is NaN or infinite, as Keras's TerminateOnNaN. The loss of a batch's
// logs is the epoch's mean so far, which a NaN or infinite step makes NaN
// or infinite at once; every worker sees the same and stops at the same
// step.
type TerminateOnNaN struct {
	BaseCallback
	stopped      bool
	epoch, batch int
}

// Name names the callback in errors.
func (t *TerminateOnNaN) Name() string { return "TerminateOnNaN" }

// StoppedAt returns the epoch and the batch after which the last Fit
// stopped, and whether it stopped.
func (t *TerminateOnNaN) StoppedAt() (epoch, batch int, ok bool) {
	return t.epoch, t.batch, t.stopped
}

// OnTrainBegin implements Callback.
func (t *TerminateOnNaN) OnTrainBegin(context.Context, *Run) error {
	t.stopped, t.epoch, t.batch = false, 0, 0
	return nil
}

// OnBatchEnd implements Callback: it stops training on a NaN or infinite
// loss.
func (t *TerminateOnNaN) OnBatchEnd(_ context.Context, r *Run, batch int, logs Logs) error {
	loss, ok := logs["loss"]
	if ok && (math.IsNaN(loss) || math.IsInf(loss, 0)) && !t.stopped {
		t.stopped, t.epoch, t.batch = true, r.Epoch(), batch
		r.StopTraining()
	}
	return nil
}
