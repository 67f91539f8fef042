// Package straggler finds the worker that holds a synchronous job back.
// Each worker reports, per window of steps, the median time its steps
// spent in input and in compute (time outside both is spent waiting for
// peers). A worker's score is the fastest worker's time over its own, as
// NVIDIA's resiliency extension reports relative performance: 1 for the
// fastest, 0.5 for one twice as slow. A worker whose score stays below a
// threshold for several windows in a row is a straggler, and the phase
// that makes it slow is the one where it exceeds the fastest worker most.
package straggler

import (
	"fmt"
	"time"
)

// Window is one worker's median step times over a window of steps.
type Window struct {
	Input, Compute time.Duration
}

// Busy is the time the worker's steps took before it could join its
// peers: input and compute.
func (w Window) Busy() time.Duration { return w.Input + w.Compute }

// Score is one worker's standing in a window.
type Score struct {
	Worker int
	// Relative is the fastest worker's busy time over this one's, in (0, 1].
	Relative float64
	// Phase is where this worker exceeds the fastest most: "input" or
	// "compute".
	Phase string
}

// Scores scores every worker of one window (windows[w] is worker w's).
func Scores(windows []Window) []Score {
	if len(windows) == 0 {
		return nil
	}
	fastest := windows[0]
	minInput, minCompute := windows[0].Input, windows[0].Compute
	for _, w := range windows[1:] {
		if w.Busy() < fastest.Busy() {
			fastest = w
		}
		minInput, minCompute = min(minInput, w.Input), min(minCompute, w.Compute)
	}
	out := make([]Score, len(windows))
	for i, w := range windows {
		rel := 1.0
		if w.Busy() > 0 {
			rel = float64(fastest.Busy()) / float64(w.Busy())
		}
		phase := "compute"
		if w.Input-minInput > w.Compute-minCompute {
			phase = "input"
		}
		out[i] = Score{Worker: i, Relative: rel, Phase: phase}
	}
	return out
}

// Detector watches the windows of a job and names a worker once it has
// scored below Threshold for Patience windows in a row.
type Detector struct {
	Threshold float64 // default 0.8: 25% slower than the fastest
	Patience  int     // default 3
	below     map[int]int
}

// Straggler is a worker the Detector named.
type Straggler struct {
	Score
	Windows int // consecutive windows below the threshold
}

func (s Straggler) String() string {
	return fmt.Sprintf("worker %d is a straggler: %.2f of the fastest worker's speed for %d windows, slow in %s", s.Worker, s.Relative, s.Windows, s.Phase)
}

// Observe takes one window of every worker's times and returns the
// workers that are stragglers as of it.
func (d *Detector) Observe(windows []Window) []Straggler {
	threshold, patience := d.Threshold, d.Patience
	if threshold <= 0 {
		threshold = 0.8
	}
	if patience <= 0 {
		patience = 3
	}
	if d.below == nil {
		d.below = map[int]int{}
	}
	var out []Straggler
	for _, s := range Scores(windows) {
		if s.Relative >= threshold {
			delete(d.below, s.Worker)
			continue
		}
		d.below[s.Worker]++
		if n := d.below[s.Worker]; n >= patience {
			out = append(out, Straggler{Score: s, Windows: n})
		}
	}
	return out
}
