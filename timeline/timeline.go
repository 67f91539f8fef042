// Package timeline records where a worker's time goes, span by span (input
// wait, a step's compute, each collective, checkpoints, evaluations), and
// writes the spans in the Chrome trace event format, which Perfetto and
// chrome://tracing open. A Recorder keeps a bounded window of the most
// recent spans, so that a long run never grows without bound; Breakdown
// splits a window's wall time into its phases.
package timeline

import (
	"sync"
	"time"
)

// Env is the environment variable that names the file a task writes its
// trace to when it ends: tfdist launch --timeline sets it for each task,
// and the multi-worker strategy reads it as it reads TF_CONFIG.
const Env = "TFDIST_TIMELINE"

// Phase is what a span's time was spent on.
type Phase string

// The phases a worker's time splits into.
const (
	Step       Phase = "step"       // a whole step, its input included
	Input      Phase = "input"      // waiting for the next batch
	Compute    Phase = "compute"    // the rest of a step: its run, and the loop between batch and run
	Collective Phase = "collective" // an all-reduce, gather or broadcast
	Wait       Phase = "wait"       // waiting for the last peer of a collective
	Checkpoint Phase = "checkpoint" // saving or restoring
	Evaluate   Phase = "evaluate"   // an evaluation pass
	Restart    Phase = "restart"    // rejoining after a failure
	Membership Phase = "membership" // forming an elastic job's next membership
	Sync       Phase = "sync"       // a local SGD synchronisation, its outer update included
)

// Span is one interval of a worker's time.
type Span struct {
	Phase Phase
	Name  string
	Start time.Time
	End   time.Time
	// Lane separates spans that overlap in time (a collective running
	// while backprop still computes): 0 is the step's own.
	Lane int
	// Args are what the trace shows of the span: nil, or a value that
	// encodes as a JSON object (a map, or a struct, which costs less to
	// record).
	Args any
}

// Duration returns the span's length.
func (s Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// DefaultCapacity is how many spans a Recorder keeps unless told otherwise:
// about 100 MB of spans at most.
const DefaultCapacity = 1 << 20

// Recorder keeps the most recent spans of one task, up to its capacity;
// older ones are dropped and counted. Its methods are safe for concurrent
// use. A nil *Recorder records nothing, so that code can call it whether
// or not a timeline was asked for.
type Recorder struct {
	mu      sync.Mutex
	spans   []Span // grows up to limit
	limit   int
	next    int // where the next span goes once spans is full
	dropped int64
}

// New returns a Recorder that keeps the most recent capacity spans
// (DefaultCapacity when capacity <= 0).
func New(capacity int) *Recorder {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Recorder{limit: capacity}
}

// Add records s.
func (r *Recorder) Add(s Span) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.spans) < r.limit {
		r.spans = append(r.spans, s)
		return
	}
	r.spans[r.next] = s
	r.next = (r.next + 1) % len(r.spans)
	r.dropped++
}

// Begin starts a span of phase p named name and returns the function that
// ends and records it, with args.
func (r *Recorder) Begin(p Phase, name string) func(args any) {
	if r == nil {
		return func(any) {}
	}
	start := time.Now()
	return func(args any) {
		r.Add(Span{Phase: p, Name: name, Start: start, End: time.Now(), Args: args})
	}
}

// Spans returns the spans kept, oldest first, and how many older ones
// were dropped.
func (r *Recorder) Spans() ([]Span, int64) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Span, 0, len(r.spans))
	out = append(out, r.spans[r.next:]...)
	out = append(out, r.spans[:r.next]...)
	return out, r.dropped
}
