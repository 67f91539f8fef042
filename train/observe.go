package train

import (
	"context"
	"time"

	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/straggler"
	"github.com/tfdist/tfdist/timeline"
)

// StragglerWindow is how many steps Fit compares the workers over when
// the strategy finds stragglers (the multi-worker strategy on tfdist's
// engine): every StragglerWindow steps the workers exchange their median
// step times, and a worker slower than the fastest by a quarter for three
// windows in a row is named in the chief's log.
const StragglerWindow = 5

// observed is a strategy that records a worker's timeline and metrics,
// as the multi-worker strategy does.
type observed interface {
	Timeline() *timeline.Recorder
	Monitoring() *monitoring.Metrics
}

// stragglerChecker is a strategy that compares its workers' steps.
type stragglerChecker interface {
	CheckStragglers(ctx context.Context, d *straggler.Detector) ([]straggler.Straggler, error)
}

// timeline returns the strategy's timeline, nil without one.
func (t *Trainer) timeline() *timeline.Recorder {
	if o, ok := t.Strategy().(observed); ok {
		return o.Timeline()
	}
	return nil
}

// monitoring returns the strategy's metrics, nil without them.
func (t *Trainer) monitoring() *monitoring.Metrics {
	if o, ok := t.Strategy().(observed); ok {
		return o.Monitoring()
	}
	return nil
}

// checkpointed records a checkpoint's save that began at start.
func (t *Trainer) checkpointed(name string, start time.Time) {
	end := time.Now()
	t.timeline().Add(timeline.Span{Phase: timeline.Checkpoint, Name: name, Start: start, End: end})
	if m := t.monitoring(); m != nil {
		m.CheckpointSeconds.Set(end.Sub(start).Seconds())
	}
}

// stepEnded records a training step's logs in the metrics, and every
// StragglerWindow steps compares the workers' steps.
func (t *Trainer) stepEnded(ctx context.Context, r *Run, logs []float64) error {
	if m := t.monitoring(); m != nil {
		m.Loss.Set(logs[0])
	}
	sc, ok := t.Strategy().(stragglerChecker)
	if !ok || r.steps%StragglerWindow != 0 {
		return nil
	}
	if r.stragglers == nil {
		r.stragglers = &straggler.Detector{}
	}
	_, err := sc.CheckStragglers(ctx, r.stragglers)
	return err
}

// epochEnded records the learning rate in the metrics, when the epoch's
// logs have it.
func (t *Trainer) epochEnded(logs Logs) {
	m := t.monitoring()
	if lr, ok := logs[LogLearningRate]; ok && m != nil {
		m.LearningRate.Set(lr)
	}
}
