package train

import (
	"context"
	"fmt"
	"io"

	"github.com/tfdist/tfdist/straggler"
)

// Callback is called by Fit as it trains, as a Keras callback: at the
// start and end of training, of every epoch and of every batch (batch
// counts from 0 in each epoch). An error stops Fit and is returned by it,
// named after the callback; so is a panic. When Fit fails, the callbacks
// that are io.Closers are closed.
//
// Under a synchronous strategy every worker calls every callback with the
// same logs; a callback that writes files writes them on the chief only
// (Run.IsChief), and one that decides to stop decides from the logs, so
// that every worker stops at the same step. Embed BaseCallback to
// implement only some hooks.
type Callback interface {
	OnTrainBegin(ctx context.Context, r *Run) error
	OnTrainEnd(ctx context.Context, r *Run, logs Logs) error
	OnEpochBegin(ctx context.Context, r *Run, epoch int) error
	OnEpochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error
	OnBatchBegin(ctx context.Context, r *Run, batch int) error
	OnBatchEnd(ctx context.Context, r *Run, batch int, logs Logs) error
}

// BaseCallback implements every hook of Callback by doing nothing.
type BaseCallback struct{}

// OnTrainBegin implements Callback.
func (BaseCallback) OnTrainBegin(context.Context, *Run) error { return nil }

// OnTrainEnd implements Callback.
func (BaseCallback) OnTrainEnd(context.Context, *Run, Logs) error { return nil }

// OnEpochBegin implements Callback.
func (BaseCallback) OnEpochBegin(context.Context, *Run, int) error { return nil }

// OnEpochEnd implements Callback.
func (BaseCallback) OnEpochEnd(context.Context, *Run, int, Logs) error { return nil }

// OnBatchBegin implements Callback.
func (BaseCallback) OnBatchBegin(context.Context, *Run, int) error { return nil }

// OnBatchEnd implements Callback.
func (BaseCallback) OnBatchEnd(context.Context, *Run, int, Logs) error { return nil }

// Run is one Fit as callbacks see it: Keras's callback.model and
// callback.params, and the model's stop_training.
type Run struct {
	t *Trainer
	// Epochs is the epoch training ends after; StepsPerEpoch the steps of
	// an epoch (0: a pass over the data).
	Epochs, StepsPerEpoch int
	// ValidationFreq is how often, in epochs, Fit validates; 0 when it
	// has no validation data.
	ValidationFreq int

	cbs                     callbacks
	epoch                   int
	steps                   int64
	stop                    bool
	acc                     *totals // the current epoch's
	resumed                 bool
	resumeEpoch, resumeStep int
	resumeTotals            []float64 // the resumed epoch's totals so far
	resumeReplicas          int       // the replicas the restored rate is scaled for
	replicas                int       // PerReplicaBatch's replicas in sync, 0 without
	stragglers              *straggler.Detector
	elastic                 *elasticFit // in an elastic job
}

// Trainer returns the model being trained.
func (r *Run) Trainer() *Trainer { return r.t }

// IsChief reports whether this process writes what only one process of
// the job should (see Trainer.IsChief).
func (r *Run) IsChief() bool { return r.t.IsChief() }

// Epoch returns the current epoch.
func (r *Run) Epoch() int { return r.epoch }

// Steps returns the steps this Fit has trained (after a resume, from where
// it resumed).
func (r *Run) Steps() int64 { return r.steps }

// StopTraining ends training after the current batch: Keras's
// model.stop_training = True.
func (r *Run) StopTraining() { r.stop = true }

// Stopping reports whether a callback has stopped training.
func (r *Run) Stopping() bool { return r.stop }

// resumeAt makes Fit start at step of epoch instead of at the initial
// epoch, skipping the batches before it (under PerReplicaBatch, the
// examples totals count), with totals (nil: none) as the epoch's totals so
// far, and the learning rate restored scaled for replicas (0: not scaled):
// what BackupAndRestore sets in OnTrainBegin after restoring a backup.
func (r *Run) resumeAt(epoch, step int, totals []float64, replicas int) {
	r.resumed, r.resumeEpoch, r.resumeStep, r.resumeTotals = true, epoch, step, totals
	r.resumeReplicas = replicas
	if m := r.t.monitoring(); m != nil {
		m.Restarts.Inc()
	}
}

// callbacks calls a list of callbacks, naming the one that fails.
type callbacks []Callback

// close closes the callbacks that are io.Closers, when Fit fails: what
// they hold open (event files) is released without waiting for
// OnTrainEnd, which a failed Fit does not call.
func (cs callbacks) close() {
	for _, c := range cs {
		if cl, ok := c.(io.Closer); ok {
			safely(cl.Close)
		}
	}
}

func (cs callbacks) each(hook string, fn func(Callback) error) error {
	for _, c := range cs {
		if err := safely(func() error { return fn(c) }); err != nil {
			return fmt.Errorf("callback %s: %s: %w", callbackName(c), hook, err)
		}
	}
	return nil
}

// safely runs fn, turning a panic into an error.
func safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn()
}

// callbackName names a callback in errors.
func callbackName(c Callback) string {
	if n, ok := c.(interface{ Name() string }); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", c)
}

func (cs callbacks) trainBegin(ctx context.Context, r *Run) error {
	return cs.each("OnTrainBegin", func(c Callback) error { return c.OnTrainBegin(ctx, r) })
}

func (cs callbacks) trainEnd(ctx context.Context, r *Run, logs Logs) error {
	return cs.each("OnTrainEnd", func(c Callback) error { return c.OnTrainEnd(ctx, r, logs) })
}

func (cs callbacks) epochBegin(ctx context.Context, r *Run, epoch int) error {
	return cs.each("OnEpochBegin", func(c Callback) error { return c.OnEpochBegin(ctx, r, epoch) })
}

func (cs callbacks) epochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error {
	return cs.each("OnEpochEnd", func(c Callback) error { return c.OnEpochEnd(ctx, r, epoch, logs) })
}

func (cs callbacks) batchBegin(ctx context.Context, r *Run, batch int) error {
	return cs.each("OnBatchBegin", func(c Callback) error { return c.OnBatchBegin(ctx, r, batch) })
}

func (cs callbacks) batchEnd(ctx context.Context, r *Run, batch int, logs Logs) error {
	return cs.each("OnBatchEnd", func(c Callback) error { return c.OnBatchEnd(ctx, r, batch, logs) })
}
