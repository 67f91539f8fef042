package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
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
// At the start of training it also writes the model's graph in
// logdir/train, for TensorBoard's Graphs tab (Keras's write_graph, which
// TensorBoardWriteGraph(false) turns off): the model's inference graph,
// as savedmodel.Export serves it, of one placeholder per model input
// (named as the input), not the training step the strategy runs.
type TensorBoard struct {
	BaseCallback
	logdir     string
	updateFreq int
	noGraph    bool
	train, val *summary.Writer
}

// TensorBoardOption configures a TensorBoard.
type TensorBoardOption func(*TensorBoard)

// TensorBoardUpdateFreq also writes the batch logs every n batches
// (Keras's update_freq=n); 0, the default, writes epochs only.
func TensorBoardUpdateFreq(n int) TensorBoardOption {
	return func(t *TensorBoard) { t.updateFreq = n }
}

// TensorBoardWriteGraph(false) does not write the model's graph
// (Keras's write_graph=False).
func TensorBoardWriteGraph(write bool) TensorBoardOption {
	return func(t *TensorBoard) { t.noGraph = !write }
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

// OnTrainBegin implements Callback: it checks the settings and writes
// the graph.
func (t *TensorBoard) OnTrainBegin(_ context.Context, r *Run) error {
	if err := t.close(); err != nil { // left open by a Fit that failed
		return err
	}
	switch {
	case t.logdir == "":
		return errors.New("empty log directory, expected a directory")
	case t.updateFreq < 0:
		return fmt.Errorf("TensorBoardUpdateFreq(%d), expected 0 (epochs only) or more", t.updateFreq)
	case t.noGraph || !r.IsChief():
		return nil
	}
	def, err := savedmodel.GraphDef([]savedmodel.Signature{servingSignature(r.Trainer().Model())})
	if err != nil {
		return err
	}
	w, err := t.writer(&t.train, "train")
	if err != nil {
		return err
	}
	return w.Graph(def)
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

// servingSignature is m's inference signature: a placeholder per input
// (named as the input, of any batch size), the outputs named output_0,
// output_1, … as Keras's export names them.
func servingSignature(m *nn.Model) savedmodel.Signature {
	in := strategy.InputSpec{}
	for _, info := range m.Inputs() {
		in[info.Name] = strategy.TensorSpec{DType: info.DType, Shape: append([]int64{-1}, info.Shape...)}
	}
	return savedmodel.Signature{
		Name:   savedmodel.DefaultSignature,
		Inputs: in,
		Fn: func(r strategy.Replica, feeds strategy.Inputs) (strategy.Outputs, error) {
			xs := make([]tf.Output, 0, len(m.Inputs()))
			for _, info := range m.Inputs() {
				xs = append(xs, feeds[info.Name])
			}
			ys, err := m.Outputs(r, xs, false)
			if err != nil {
				return nil, err
			}
			outs := strategy.Outputs{}
			for i, y := range ys {
				outs[fmt.Sprintf("output_%d", i)] = y
			}
			return outs, nil
		},
	}
}
