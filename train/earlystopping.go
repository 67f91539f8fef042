package train

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// EarlyStopping stops training when a monitored quantity has stopped
// improving, as Keras's EarlyStopping: at the end of every epoch from
// StartFromEpoch on, a value of Monitor better than the best so far by
// more than MinDelta is an improvement; after Patience epochs without one
// (and not at the first epoch), it stops training.
//
// The decision comes from the logs alone, which every worker of a
// synchronous strategy has alike, so every worker stops at the same
// epoch. A Monitor missing from an epoch's logs is an error rather than
// Keras's warning, since a misspelt key would silently disable it; a
// validation key is skipped at epochs that do not validate
// (ValidationFreq), and is an error at the end of training if no epoch
// had it.
//
// Use it by pointer; Fit resets it at the start of training, so one value
// serves several Fits.
type EarlyStopping struct {
	BaseCallback
	// Monitor is the log key watched (default DefaultMonitor, "val_loss").
	Monitor string
	// MinDelta is the change that counts as an improvement; its sign is
	// ignored.
	MinDelta float64
	// Patience is the number of epochs without improvement after which
	// training stops (default 0: the first epoch that does not improve).
	Patience int
	// Mode is "min", "max", or "auto" (the default): max for a key whose
	// name contains "acc" or "auc", min otherwise.
	Mode string
	// Baseline, when set, is a value to beat: an epoch that improves on
	// the best but not on Baseline does not reset the patience.
	Baseline *float64
	// RestoreBestWeights makes the model's variables, at the end of
	// training, those of the epoch with the best value (its float
	// variables: weights and statistics such as BatchNorm's, not integer
	// counters, and not the optimizer's slots, as in Keras). As in Keras
	// 3, they are restored whether or not training stopped early, as soon
	// as an epoch was monitored. It needs a strategy that assigns
	// variables outside a replica (the default strategy, mirrored,
	// multiworker), not parameter servers, and costs a read of the model
	// at every improving epoch.
	RestoreBestWeights bool
	// StartFromEpoch is the first epoch monitored: the epochs before it
	// are a warm-up that neither improves nor stops.
	StartFromEpoch int

	mon          monitor
	best         float64
	wait         int
	bestEpoch    int
	stoppedEpoch int
	vars         []strategy.Variable
	weights      []strategy.VariableValue // at bestEpoch; nil until an epoch is monitored
}

// assigner writes a variable outside any replica (metrics.Assigner).
type assigner interface {
	Assign(ctx context.Context, v strategy.Variable, value *tf.Tensor) error
}

// Name names the callback in errors.
func (e *EarlyStopping) Name() string { return "EarlyStopping" }

// BestEpoch returns the epoch of the best value of the last Fit.
func (e *EarlyStopping) BestEpoch() int { return e.bestEpoch }

// StoppedEpoch returns the epoch after which the last Fit stopped, or -1
// if it did not stop training.
func (e *EarlyStopping) StoppedEpoch() int { return e.stoppedEpoch }

// OnTrainBegin implements Callback: it checks the settings and resets the
// state.
func (e *EarlyStopping) OnTrainBegin(_ context.Context, r *Run) error {
	switch {
	case e.Patience < 0:
		return fmt.Errorf("negative Patience %d, expected 0 or more", e.Patience)
	case e.StartFromEpoch < 0:
		return fmt.Errorf("StartFromEpoch %d, expected 0 or more", e.StartFromEpoch)
	}
	mon, err := newMonitor(e.Monitor, e.Mode)
	if err != nil {
		return err
	}
	if err := mon.validated(r); err != nil {
		return err
	}
	e.mon, e.best, e.wait, e.bestEpoch, e.stoppedEpoch = mon, mon.worst(), 0, 0, -1
	e.vars, e.weights = nil, nil
	if !e.RestoreBestWeights {
		return nil
	}
	s := r.Trainer().Strategy()
	_, canRead := s.(strategy.ValueReader)
	if _, canAssign := s.(assigner); !canRead || !canAssign {
		return fmt.Errorf("RestoreBestWeights: the strategy %T cannot assign variables outside a replica, expected the default strategy, mirrored or multiworker", s)
	}
	for _, v := range r.Trainer().Model().Variables() {
		if dt := v.DType(); dt == tf.Float || dt == tf.Double {
			e.vars = append(e.vars, v)
		}
	}
	return nil
}

// OnEpochEnd implements Callback: it compares the monitored value with
// the best and stops training when patience has run out.
func (e *EarlyStopping) OnEpochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error {
	v, ok, err := e.mon.value(logs, fmt.Sprintf("epoch %d", epoch), true)
	if err != nil || !ok || epoch < e.StartFromEpoch {
		return err
	}
	delta := math.Abs(e.MinDelta)
	improved := e.mon.improves(v, e.best, delta)
	if e.RestoreBestWeights && (improved || e.weights == nil) {
		if err := e.snapshot(ctx, r); err != nil {
			return fmt.Errorf("RestoreBestWeights: epoch %d: %w", epoch, err)
		}
		e.bestEpoch = epoch
	}
	e.wait++
	if improved {
		e.best, e.bestEpoch = v, epoch
		if e.Baseline == nil || e.mon.improves(v, *e.Baseline, delta) {
			e.wait = 0
		}
		return nil
	}
	if e.wait >= e.Patience && epoch > 0 {
		e.stoppedEpoch = epoch
		r.StopTraining()
	}
	return nil
}

// OnTrainEnd implements Callback: it restores the best weights.
func (e *EarlyStopping) OnTrainEnd(ctx context.Context, r *Run, _ Logs) error {
	if err := e.mon.check(); err != nil {
		return err
	}
	if !e.RestoreBestWeights || e.weights == nil {
		return nil
	}
	s := r.Trainer().Strategy().(assigner)
	for i, v := range e.vars {
		t, err := tensorOf(v.DType(), e.weights[i])
		if err == nil {
			err = s.Assign(ctx, v, t)
		}
		if err != nil {
			return fmt.Errorf("RestoreBestWeights: variable %q of epoch %d: %w", v.Name(), e.bestEpoch, err)
		}
	}
	return nil
}

// snapshot reads the model's variables.
func (e *EarlyStopping) snapshot(ctx context.Context, r *Run) error {
	w, err := strategy.ReadVariables(ctx, r.Trainer().Strategy().(strategy.ValueReader), e.vars)
	if err != nil {
		return err
	}
	e.weights = w
	return nil
}

// tensorOf makes a tensor of dtype (float32 or float64) of a read value.
func tensorOf(dtype tf.DataType, v strategy.VariableValue) (*tf.Tensor, error) {
	var buf bytes.Buffer
	var data any = v.Float32
	if dtype == tf.Double {
		data = v.Float64
	}
	if err := binary.Write(&buf, binary.LittleEndian, data); err != nil {
		return nil, err
	}
	return tf.ReadTensor(dtype, v.Shape, &buf)
}
