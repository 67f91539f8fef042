package train

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// LogLearningRate is the key of the learning rate an epoch trained at in
// the epoch's logs, which ReduceLROnPlateau and LearningRateScheduler add
// as Keras's do.
const LogLearningRate = "learning_rate"

// adjustable returns the optimizer's Adjustable rate and the strategy's
// State it lives in.
func (t *Trainer) adjustable() (*optimizer.Adjustable, strategy.State, error) {
	a, err := optimizer.AdjustableOf(t.opt)
	if err != nil {
		return nil, nil, err
	}
	src, ok := t.Strategy().(interface{ State() strategy.State })
	if !ok {
		return nil, nil, fmt.Errorf("strategy of type %T has no State to keep a learning rate in", t.Strategy())
	}
	return a, src.State(), nil
}

// LearningRate returns the rate the optimizer's next step trains at: Keras's
// model.optimizer.learning_rate. The optimizer's schedule must be an
// optimizer.Adjustable (optimizer.NewAdjustable); the error names it
// otherwise.
func (t *Trainer) LearningRate(ctx context.Context) (float64, error) {
	a, st, err := t.adjustable()
	if err == nil {
		var lr float32
		if lr, err = a.Value(ctx, st); err == nil {
			return float64(lr), nil
		}
	}
	return 0, fmt.Errorf("train: LearningRate: %w", err)
}

// SetLearningRate sets the rate of the optimizer's later steps, as Keras's
// model.optimizer.learning_rate = lr: a float32, finite and not negative.
// The optimizer's schedule must be an optimizer.Adjustable. Under a
// synchronous strategy of several workers every worker sets the same
// rate; under parameter servers the chief sets it while no step runs (as
// callbacks do).
func (t *Trainer) SetLearningRate(ctx context.Context, lr float64) error {
	if math.IsNaN(lr) || lr < 0 || lr > math.MaxFloat32 {
		return fmt.Errorf("train: SetLearningRate: %v, expected a finite float32 >= 0", lr)
	}
	a, st, err := t.adjustable()
	if err == nil {
		err = a.Set(ctx, st, float32(lr))
	}
	if err != nil {
		return fmt.Errorf("train: SetLearningRate(%v): %w", lr, err)
	}
	return nil
}

// ReduceLROnPlateau is Keras's ReduceLROnPlateau callback: at the end of
// an epoch it multiplies the learning rate by Factor when Monitor has not
// improved for Patience epochs, and then waits Cooldown epochs before
// counting again. It adds "learning_rate", the rate the epoch trained at,
// to the epoch's logs. The compiled optimizer's schedule must be an
// optimizer.Adjustable.
//
// A zero field takes Keras's default. An epoch whose logs lack Monitor —
// one that did not validate, under ValidationFreq — is skipped; Fit fails
// when an epoch's logs lack it otherwise (a training key, or a validation
// key at an epoch that validated), and at the end when no epoch had it.
// The callback's state starts afresh at each Fit, as Keras's does, so a
// run resumed from a backup resumes with the rate reduced but counts
// Patience anew.
type ReduceLROnPlateau struct {
	BaseCallback
	// Monitor is the key of the logs watched (default "val_loss").
	Monitor string
	// Factor multiplies the rate at a reduction, 0 < Factor < 1 (default
	// 0.1).
	Factor float64
	// Patience is the epochs without improvement after which the rate is
	// reduced (default 10; 1 reduces at the first such epoch, as Keras's
	// 0 and 1 do).
	Patience int
	// Mode says which way improves: "min", "max", or "auto" (the default),
	// which is "max" for a Monitor containing "acc" or "auc" (Keras's
	// ReduceLROnPlateau: "acc" only) and "min" otherwise, as EarlyStopping.
	Mode string
	// MinDelta is how much Monitor must improve on its best to count
	// (default 1e-4; a negative MinDelta counts any improvement).
	MinDelta float64
	// Cooldown is the epochs after a reduction during which no epoch
	// counts as one without improvement.
	Cooldown int
	// MinLR is the lowest rate a reduction goes to.
	MinLR float64

	mon                    monitor
	factor, minDelta, best float64
	patience               int
	ended                  bool
	wait, cooldown         int
}

// Name implements the name callbacks are known by in errors.
func (p *ReduceLROnPlateau) Name() string { return "ReduceLROnPlateau" }

// OnTrainBegin checks the fields and the optimizer and resets the state.
func (p *ReduceLROnPlateau) OnTrainBegin(ctx context.Context, r *Run) error {
	p.factor, p.patience, p.minDelta = cmp.Or(p.Factor, 0.1), cmp.Or(p.Patience, 10), cmp.Or(p.MinDelta, 1e-4)
	switch {
	case !(p.factor > 0 && p.factor < 1):
		return fmt.Errorf("reduction Factor %v, expected 0 < Factor < 1 (or 0: Keras's default, 0.1)", p.Factor)
	case p.patience < 0:
		return fmt.Errorf("negative Patience %d, expected 0 (Keras's default, 10) or more", p.Patience)
	case p.Cooldown < 0:
		return fmt.Errorf("negative Cooldown %d, expected 0 or more", p.Cooldown)
	case math.IsNaN(p.MinDelta):
		return errors.New("MinDelta NaN, expected a number")
	case !(p.MinLR >= 0) || math.IsInf(p.MinLR, 1):
		return fmt.Errorf("MinLR %v, expected a finite rate >= 0", p.MinLR)
	}
	p.minDelta = max(p.minDelta, 0)
	var err error
	if p.mon, err = newMonitor(p.Monitor, p.Mode); err != nil {
		return err
	}
	if err := p.mon.validated(r); err != nil {
		return err
	}
	p.best = p.mon.worst()
	p.wait, p.cooldown, p.ended = 0, 0, false
	_, err = r.Trainer().LearningRate(ctx)
	return err
}

// OnEpochEnd logs the epoch's rate and reduces it if Monitor has stopped
// improving.
func (p *ReduceLROnPlateau) OnEpochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error {
	lr, err := r.Trainer().LearningRate(ctx)
	if err != nil {
		return err
	}
	if logs != nil {
		logs[LogLearningRate] = lr
	}
	p.ended = true
	current, ok, err := p.mon.value(logs, fmt.Sprintf("epoch %d", epoch), true)
	if !ok {
		return err
	}
	if p.cooldown > 0 {
		p.cooldown--
		p.wait = 0
	}
	if p.mon.improves(current, p.best, p.minDelta) {
		p.best, p.wait = current, 0
		return nil
	}
	if p.cooldown > 0 {
		return nil
	}
	p.wait++
	if p.wait < p.patience || !(lr > float64(float32(p.MinLR))) {
		return nil
	}
	if err := r.Trainer().SetLearningRate(ctx, max(lr*p.factor, p.MinLR)); err != nil {
		return err
	}
	p.cooldown, p.wait = p.Cooldown, 0
	return nil
}

// OnTrainEnd fails when epochs ended and none had Monitor: a validation
// key when no epoch validated.
func (p *ReduceLROnPlateau) OnTrainEnd(context.Context, *Run, Logs) error {
	if !p.ended {
		return nil
	}
	return p.mon.check()
}

// LearningRateScheduler is Keras's LearningRateScheduler callback: at the
// start of each epoch it sets the learning rate to Schedule(epoch, the
// current rate), and it adds "learning_rate", the rate the epoch trained
// at, to the epoch's logs. The compiled optimizer's schedule must be an
// optimizer.Adjustable. Under a synchronous strategy of several workers
// Schedule must return the same rate on every worker.
type LearningRateScheduler struct {
	BaseCallback
	// Schedule returns the rate of epoch (from 0) given the current rate.
	Schedule func(epoch int, lr float64) float64
}

// Name implements the name callbacks are known by in errors.
func (s *LearningRateScheduler) Name() string { return "LearningRateScheduler" }

// OnTrainBegin checks the Schedule and the optimizer.
func (s *LearningRateScheduler) OnTrainBegin(ctx context.Context, r *Run) error {
	if s.Schedule == nil {
		return errors.New("nil Schedule, expected a function of the epoch and the rate")
	}
	_, err := r.Trainer().LearningRate(ctx)
	return err
}

// OnEpochBegin sets the epoch's rate.
func (s *LearningRateScheduler) OnEpochBegin(ctx context.Context, r *Run, epoch int) error {
	lr, err := r.Trainer().LearningRate(ctx)
	if err != nil {
		return err
	}
	next := s.Schedule(epoch, lr)
	if math.IsNaN(next) || next < 0 || next > math.MaxFloat32 {
		return fmt.Errorf("rate %v from Schedule(%d, %v), expected a finite float32 >= 0", next, epoch, lr)
	}
	return r.Trainer().SetLearningRate(ctx, next)
}

// OnEpochEnd logs the rate the epoch trained at.
func (s *LearningRateScheduler) OnEpochEnd(ctx context.Context, r *Run, _ int, logs Logs) error {
	lr, err := r.Trainer().LearningRate(ctx)
	if err != nil {
		return err
	}
	if logs != nil {
		logs[LogLearningRate] = lr
	}
	return nil
}
