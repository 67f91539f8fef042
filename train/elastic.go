package train

import (
	"context"
	"encoding/json"
	"fmt"
)

// elasticStrategy is the strategy of one membership of an elastic job
// (multiworker.RunElastic's): Fit resumes on it where the job was, and
// keeps its progress with the state at every step and every epoch's end.
type elasticStrategy interface {
	Elastic() bool
	Resume(ctx context.Context) (int64, error)
	StepDone(ctx context.Context) error
	SetProgress(p []byte)
	Progress() []byte
}

// elasticFit is a Fit's part in an elastic job.
type elasticFit struct {
	s    elasticStrategy
	hist *History
	logs Logs // the last epoch's, for OnTrainEnd
}

// fitProgress is where a Fit of an elastic job is, after a step or an
// epoch's end: what the workers of the next membership go on from.
type fitProgress struct {
	Epoch    int       `json:"epoch"`
	Step     int       `json:"step"`               // the steps of Epoch done
	Totals   []float64 `json:"totals,omitempty"`   // Epoch's logs so far, its examples among them
	Steps    int64     `json:"steps"`              // Run.Steps
	Replicas int       `json:"replicas,omitempty"` // PerReplicaBatch's, the rate scaled for them
	Stop     bool      `json:"stop,omitempty"`
	Logs     Logs      `json:"logs,omitempty"` // the last epoch's
	History  *History  `json:"history"`
}

// resumeElastic, on a strategy of an elastic job, takes the state of the
// job's newest step (Resume) and has r go on from the progress kept with
// it: the epoch, the step in it, its logs so far, and the History of the
// epochs before.
func (t *Trainer) resumeElastic(ctx context.Context, r *Run, h *History) error {
	s, ok := t.eng.strategy().(elasticStrategy)
	if !ok || !s.Elastic() {
		return nil
	}
	r.elastic = &elasticFit{s: s, hist: h}
	if _, err := s.Resume(ctx); err != nil {
		return err
	}
	raw := s.Progress()
	if raw == nil {
		return nil // a new job
	}
	var p fitProgress
	if err := json.Unmarshal(raw, &p); err != nil || p.History == nil {
		return fmt.Errorf("the elastic job's progress is not a Fit's (did another program set it?): %q", raw)
	}
	r.resumeAt(p.Epoch, p.Step, p.Totals, p.Replicas)
	r.steps, r.stop, r.elastic.logs = p.Steps, p.Stop, p.Logs
	*h = *p.History
	if h.Values == nil {
		h.Values = map[string][]float64{}
	}
	return nil
}

// keepProgress, in an elastic job, ends a step (or an epoch, with step
// 0): it keeps the state with r's progress, at step of epoch with the
// epoch's totals so far, and agrees on the membership (an error wrapping
// multiworker.ErrMembershipChanged when it changes here).
func (r *Run) keepProgress(ctx context.Context, epoch, step int, totals []float64) error {
	el := r.elastic
	if el == nil {
		return nil
	}
	p, err := json.Marshal(fitProgress{Epoch: epoch, Step: step, Totals: totals, Steps: r.steps, Replicas: r.replicas, Stop: r.stop, Logs: el.logs, History: el.hist})
	if err != nil {
		return err
	}
	el.s.SetProgress(p)
	return el.s.StepDone(ctx)
}
