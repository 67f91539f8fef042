package classifier

import (
	"math"
	"time"
)

// StepTimes summarizes how long a run's training steps took: on the
// in-graph strategies each step's run, its input included; under
// -strategy ps each step from the start of its first run on a worker to
// the end of its last (a step that a failed worker sent back counts its
// failed runs and its wait to run again). The first step of each worker,
// which builds and loads the step's graph, is warm-up: counted in Warmup,
// not in the figures.
type StepTimes struct {
	Steps  int `json:"steps"`
	Warmup int `json:"warmup"`
	// The quantiles are the geometric middle of their histogram bucket,
	// within 1.1% of the exact figure; MaxMS is exact.
	MedianMS float64 `json:"median_ms"`
	P99MS    float64 `json:"p99_ms"`
	P999MS   float64 `json:"p999_ms"`
	MaxMS    float64 `json:"max_ms"`
}

// stepBuckets is the resolution of stepTimes: 32 buckets per doubling.
const stepBuckets = 32

// stepTimes is a histogram of step durations on a log scale from 1 µs, so
// that a run of millions of steps keeps a few hundred counters.
type stepTimes struct {
	warm   map[int]bool // the workers whose warm-up step was seen
	counts []int
	n      int
	warmup int
	max    time.Duration
}

// add counts a step that took d on worker (0 for a synchronous step of
// every worker): warm-up when it is the worker's first.
func (s *stepTimes) add(worker int, d time.Duration) {
	if !s.warm[worker] {
		if s.warm == nil {
			s.warm = map[int]bool{}
		}
		s.warm[worker] = true
		s.warmup++
		return
	}
	i := 0
	if d > time.Microsecond {
		i = int(stepBuckets * math.Log2(float64(d)/float64(time.Microsecond)))
	}
	if i >= len(s.counts) {
		s.counts = append(s.counts, make([]int, i+1-len(s.counts))...)
	}
	s.counts[i]++
	s.n++
	s.max = max(s.max, d)
}

// summary returns the figures of the steps added; nil before any.
func (s *stepTimes) summary() *StepTimes {
	if s.n == 0 {
		return nil
	}
	return &StepTimes{Steps: s.n, Warmup: s.warmup, MedianMS: s.quantile(0.5), P99MS: s.quantile(0.99),
		P999MS: s.quantile(0.999), MaxMS: float64(s.max) / float64(time.Millisecond)}
}

// quantile returns the q-quantile in milliseconds: the geometric middle of
// the bucket that holds it.
func (s *stepTimes) quantile(q float64) float64 {
	rank := int(math.Ceil(q * float64(s.n)))
	seen, i := 0, 0
	for i = range s.counts {
		if seen += s.counts[i]; seen >= rank {
			break
		}
	}
	return math.Exp2((float64(i)+0.5)/stepBuckets) * float64(time.Microsecond) / float64(time.Millisecond)
}
