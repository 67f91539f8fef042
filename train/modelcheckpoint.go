package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/role"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// Metadata keys of the checkpoints ModelCheckpoint saves, besides
// checkpoint.GlobalStepKey (the steps this Fit had trained).
const (
	// CheckpointEpochKey holds the epoch saved (int64, from 0).
	CheckpointEpochKey = "epoch"
	// CheckpointBatchKey holds the batch of the epoch after which a
	// checkpoint was saved, when SaveFreq saves every few batches (int64).
	CheckpointBatchKey = "batch"
	// CheckpointLogsPrefix prefixes each log key of the epoch (or batch)
	// saved: "logs/val_loss" holds its val_loss (float64).
	CheckpointLogsPrefix = "logs/"
)

// ModelCheckpoint saves the model during training, as Keras's
// ModelCheckpoint: at the end of every epoch, or every SaveFreq batches,
// a checkpoint ckpt-<steps> in Dir, steps being the steps the Fit has
// trained (Run.Steps), by package checkpoint's Manager (atomic,
// TensorFlow's format, a state file naming the newest). Its metadata hold
// the epoch, the batch and the logs (CheckpointEpochKey, …). With
// SaveBestOnly it saves only when Monitor improves on the best value it
// has saved, so the newest checkpoint is the best.
//
// Only the chief writes Dir: every worker of a synchronous strategy takes
// part in each save (the decision comes from the logs, alike on every
// worker), and the others' saves go to a temporary directory that is
// removed at once (see package checkpoint, "Which task writes").
//
// Use it by pointer. As in Keras, the best value is kept from one Fit to
// the next.
type ModelCheckpoint struct {
	BaseCallback
	// Dir is the directory of the checkpoints.
	Dir string
	// Monitor is the log key SaveBestOnly watches (default
	// DefaultMonitor, "val_loss"); Mode is "min", "max" or "auto", as for
	// EarlyStopping.
	Monitor, Mode string
	// SaveBestOnly saves only when Monitor improves on the best value
	// saved.
	SaveBestOnly bool
	// SaveWeightsOnly saves the model's variables only; otherwise every
	// variable of the strategy is saved, the optimizer's slots and step
	// count included, so that training can resume from the checkpoint.
	SaveWeightsOnly bool
	// SaveFreq saves every SaveFreq batches, counted across epochs, from
	// the batch logs (a validation Monitor is then an error); 0 (the
	// default) saves at the end of every epoch.
	SaveFreq int
	// MaxToKeep keeps the newest MaxToKeep checkpoints; 0 (the default)
	// keeps every one, as Keras does with a file name per epoch.
	MaxToKeep int
	// Options are further options of the checkpoint.Manager
	// (checkpoint.WithLogger, WithWorkerTempDir, WithCheckpointName, …).
	Options []checkpoint.Option

	mon     monitor
	best    float64
	hasBest bool
	batches int
	m       *checkpoint.Manager
	key     managerKey
}

// managerKey is what the Manager was made for.
type managerKey struct {
	s           Strategy
	model       *nn.Model
	dir         string
	weightsOnly bool
	maxToKeep   int
}

// Name names the callback in errors.
func (c *ModelCheckpoint) Name() string { return "ModelCheckpoint" }

// Manager returns the checkpoint.Manager of the last Fit (nil before).
func (c *ModelCheckpoint) Manager() *checkpoint.Manager { return c.m }

// OnTrainBegin implements Callback: it checks the settings and makes the
// Manager.
func (c *ModelCheckpoint) OnTrainBegin(_ context.Context, r *Run) error {
	switch {
	case c.Dir == "":
		return errors.New("empty Dir, expected a directory")
	case c.SaveFreq < 0:
		return fmt.Errorf("SaveFreq %d, expected 0 (every epoch) or a number of batches", c.SaveFreq)
	case c.MaxToKeep < 0:
		return fmt.Errorf("MaxToKeep %d, expected 0 (keep all) or more", c.MaxToKeep)
	}
	mon, err := newMonitor(c.Monitor, c.Mode)
	if err != nil {
		return err
	}
	if c.SaveBestOnly {
		if err := mon.validated(r); err != nil {
			return err
		}
	}
	if mon.key != c.mon.key || mon.max != c.mon.max {
		c.hasBest = false
	}
	c.mon, c.batches = mon, 0
	key := managerKey{r.Trainer().Strategy(), r.Trainer().Model(), c.Dir, c.SaveWeightsOnly, c.MaxToKeep}
	if c.m != nil && c.key == key {
		return nil
	}
	src, ok := key.s.(checkpoint.Source)
	if !ok {
		return fmt.Errorf("the strategy %T has no State, expected a strategy package checkpoint saves", key.s)
	}
	if c.SaveWeightsOnly {
		src = modelSource{src: src, names: varNames(key.model.Variables())}
	}
	m, err := checkpoint.NewManager(src, c.Dir, append([]checkpoint.Option{checkpoint.WithMaxToKeep(c.MaxToKeep)}, c.Options...)...)
	if err != nil {
		return err
	}
	c.m, c.key = m, key
	return nil
}

// OnBatchEnd implements Callback: it saves every SaveFreq batches.
func (c *ModelCheckpoint) OnBatchEnd(ctx context.Context, r *Run, batch int, logs Logs) error {
	if c.SaveFreq == 0 {
		return nil
	}
	if c.batches++; c.batches < c.SaveFreq {
		return nil
	}
	c.batches = 0
	return c.save(ctx, r, batch, logs, fmt.Sprintf("batch %d of epoch %d", batch, r.Epoch()))
}

// OnEpochEnd implements Callback: it saves, with SaveFreq 0.
func (c *ModelCheckpoint) OnEpochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error {
	if c.SaveFreq != 0 {
		return nil
	}
	return c.save(ctx, r, -1, logs, fmt.Sprintf("epoch %d", epoch))
}

// OnTrainEnd implements Callback: a validation Monitor no epoch had is an
// error.
func (c *ModelCheckpoint) OnTrainEnd(context.Context, *Run, Logs) error {
	if !c.SaveBestOnly {
		return nil
	}
	return c.mon.check()
}

// save saves a checkpoint after batch of the current epoch (-1: at its
// end), if it is due.
func (c *ModelCheckpoint) save(ctx context.Context, r *Run, batch int, logs Logs, what string) error {
	if c.SaveBestOnly {
		v, ok, err := c.mon.value(logs, what, batch < 0)
		if err != nil || !ok {
			return err
		}
		best := c.mon.worst()
		if c.hasBest {
			best = c.best
		}
		if !c.mon.improves(v, best, 0) {
			return nil
		}
		c.best, c.hasBest = v, true
	}
	md := checkpoint.Metadata{CheckpointEpochKey: int64(r.Epoch())}
	if batch >= 0 {
		md[CheckpointBatchKey] = int64(batch)
	}
	for k, v := range logs {
		md[CheckpointLogsPrefix+k] = v
	}
	defer r.t.checkpointed("model checkpoint", time.Now())
	if _, err := c.m.Save(ctx, r.Steps(), md); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// modelSource is a checkpoint.Source of a model's variables only.
type modelSource struct {
	src   checkpoint.Source
	names map[string]bool
}

func (m modelSource) State() strategy.State { return modelState{m.src.State(), m.names} }

// IsChief follows the strategy's role, as checkpoint.NewManager does.
func (m modelSource) IsChief() bool { return role.IsChief(m.src) }

// modelState is a strategy's State whose checkpoints hold the variables
// named.
type modelState struct {
	strategy.State
	names map[string]bool
}

func (s modelState) Saveables() []strategy.Saveable {
	var out []strategy.Saveable
	for _, v := range s.State.Saveables() {
		if s.names[v.Name] {
			out = append(out, v)
		}
	}
	return out
}

func varNames(vs []strategy.Variable) map[string]bool {
	out := map[string]bool{}
	for _, v := range vs {
		out[v.Name()] = true
	}
	return out
}
