package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tfdist/tfdist/summary"
)

// TensorBoard writes the logs as TensorBoard scalars, in Keras's layout:
// every epoch, each training key k (the loss, the metrics,
// "learning_rate" when the logs have it) as "epoch_"+k in logdir/train,
// and each validation key "val_"+k as "epoch_"+k in logdir/validation,
// at step epoch; with TensorBoardUpdateFreq(n), every n-th batch the
// batch logs as "batch_"+k in logdir/train, at the step count. It writes
// (package summary) only on the chief. Each event is flushed as it is
// written, so what a failed Fit logged is in the files; the files are
// closed at the end of training.
//
// It does not write the model's graph: the strategies do not expose their
// GraphDef.
type TensorBoard struct {
	BaseCallback
	logdir     string
	updateFreq int
	train, val *summary.Writer
}

// TensorBoardOption configures a TensorBoard.
type TensorBoardOption func(*TensorBoard)

// TensorBoardUpdateFreq also writes the batch logs every n batches
// (Keras's update_freq=n); 0, the default, writes epochs only.
func TensorBoardUpdateFreq(n int) TensorBoardOption {
	return func(t *TensorBoard) { t.updateFreq = n }
}

// NewTensorBoard returns a TensorBoard writing under logdir.
func NewTensorBoard(logdir string, opts ...TensorBoardOption) *TensorBoard {
	t := &TensorBoard{logdir: logdir}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Name names the callback in errors.
func (t *TensorBoard) Name() string { return "TensorBoard" }

// OnTrainBegin implements Callback: it checks the settings.
func (t *TensorBoard) OnTrainBegin(context.Context, *Run) error {
	if err := t.close(); err != nil { // left open by a Fit that failed
		return err
	}
	switch {
	case t.logdir == "":
		return errors.New("empty log directory, expected a directory")
	case t.updateFreq < 0:
		return fmt.Errorf("TensorBoardUpdateFreq(%d), expected 0 (epochs only) or more", t.updateFreq)
	}
	return nil
}

// OnBatchEnd implements Callback: it writes the batch logs every
// updateFreq steps.
func (t *TensorBoard) OnBatchEnd(_ context.Context, r *Run, _ int, logs Logs) error {
	if t.updateFreq == 0 || r.Steps()%int64(t.updateFreq) != 0 || !r.IsChief() {
		return nil
	}
	w, err := t.writer(&t.train, "train")
	if err != nil {
		return err
	}
	return w.Scalars(r.Steps(), prefixed(logs, "batch_", false))
}

// OnEpochEnd implements Callback: it writes the epoch's logs.
func (t *TensorBoard) OnEpochEnd(_ context.Context, r *Run, epoch int, logs Logs) error {
	if !r.IsChief() {
		return nil
	}
	w, err := t.writer(&t.train, "train")
	if err == nil {
		err = w.Scalars(int64(epoch), prefixed(logs, "epoch_", false))
	}
	if err != nil || !validated(logs) {
		return err
	}
	if w, err = t.writer(&t.val, "validation"); err != nil {
		return err
	}
	return w.Scalars(int64(epoch), prefixed(logs, "epoch_", true))
}

// OnTrainEnd implements Callback: it closes the event files.
func (t *TensorBoard) OnTrainEnd(context.Context, *Run, Logs) error { return t.close() }

// writer returns *w, creating it in the subdirectory sub on first use.
func (t *TensorBoard) writer(w **summary.Writer, sub string) (*summary.Writer, error) {
	if *w == nil {
		nw, err := summary.NewWriter(filepath.Join(t.logdir, sub), summary.WithFlushInterval(0))
		if err != nil {
			return nil, err
		}
		*w = nw
	}
	return *w, nil
}

// Close closes the event files; Fit closes them when it fails.
func (t *TensorBoard) Close() error { return t.close() }

func (t *TensorBoard) close() error {
	err := errors.Join(t.train.Close(), t.val.Close())
	t.train, t.val = nil, nil
	return err
}

// prefixed returns the training keys of logs (val: the validation keys,
// without "val_") under prefix.
func prefixed(logs Logs, prefix string, val bool) map[string]float64 {
	out := map[string]float64{}
	for k, v := range logs {
		name, isVal := strings.CutPrefix(k, "val_")
		if isVal == val {
			out[prefix+name] = v
		}
	}
	return out
}
