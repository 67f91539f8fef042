package multiworker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/fsutil"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/straggler"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// WithTimeline records this worker's spans onto rec: each step's input
// wait and compute, and, on tfdist's engine, each collective operation
// with the time it waited for the last peer. Without it, a worker whose
// environment names a file in TFDIST_TIMELINE (tfdist launch --timeline
// sets it) records into a Recorder of its own and writes its trace there
// at Close.
func WithTimeline(rec *timeline.Recorder) Option { return func(c *config) { c.timeline = rec } }

// WithMonitoring records this worker's steps, examples, input waits and,
// on tfdist's engine, all-reduces and collective timeouts into m. Without
// it, a worker whose environment gives an address in TFDIST_METRICS_ADDR
// (tfdist launch --metrics sets it) serves metrics of its own there until
// Close.
func WithMonitoring(m *monitoring.Metrics) Option { return func(c *config) { c.metrics = m } }

// maxWindow bounds the steps a straggler window keeps, for a loop that
// never calls CheckStragglers.
const maxWindow = 4096

// observer is what a worker records of its own steps and collectives.
type observer struct {
	rec       *timeline.Recorder // nil: no timeline
	m         *monitoring.Metrics
	tracePath string             // write rec here at Close
	stopServe context.CancelFunc // stops serving m
	task      string

	mu        sync.Mutex
	lanes     []time.Time       // by lane (1 on): the end of its last collective span
	waitNames map[string]string // "wait for " + a member's name, by name
	steps     int64
	lastEnd   time.Time
	inputs    []time.Duration // the current window's, by step
	computes  []time.Duration
}

// newObserver sets up the timeline and metrics c and the environment ask
// for.
func newObserver(c config, task string) (*observer, error) {
	o := &observer{rec: c.timeline, m: c.metrics, task: task, waitNames: map[string]string{}}
	if path := os.Getenv(timeline.Env); path != "" && o.rec == nil {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("multiworker: %s=%q: the timeline cannot be written: %w", timeline.Env, path, err)
		}
		f.Close()
		o.rec, o.tracePath = timeline.New(0), path
	}
	if addr := os.Getenv(monitoring.Env); addr != "" && o.m == nil {
		o.m = monitoring.New(task)
		sctx, cancel := context.WithCancel(context.Background())
		if _, err := o.m.Serve(sctx, addr); err != nil {
			cancel()
			return nil, fmt.Errorf("multiworker: %s=%q: %w", monitoring.Env, addr, err)
		}
		o.stopServe = cancel
	}
	return o, nil
}

// collective is the group's observer: a span per operation, and the
// all-reduces' bytes, times and timeouts.
func (o *observer) collective(r collective.Record) {
	if o.m != nil {
		// A reduce-scatter (WithZeRO) reduces the gradients an
		// all-reduce would.
		if r.Op == "all-reduce" || r.Op == "reduce-scatter" {
			o.m.AllReducedBytes.Add(float64(r.Bytes))
			o.m.AllReduceSeconds.Observe(r.End.Sub(r.Start).Seconds())
		}
		var timeout *collective.TimeoutError
		if errors.As(r.Err, &timeout) {
			o.m.CollectiveTimeouts.Inc()
		}
	}
	if o.rec == nil {
		return
	}
	lane, wait := o.lane(r)
	args := &collectiveArgs{Op: r.Op, Bytes: r.Bytes, Algorithm: r.Algorithm, Transport: r.Transport,
		Last: r.Last.Name, MarginUS: r.Margin.Microseconds()}
	if r.Err != nil {
		args.Error = r.Err.Error()
	}
	o.rec.Add(timeline.Span{Phase: timeline.Collective, Name: r.Name, Start: r.Start, End: r.End, Lane: lane, Args: args})
	if r.Wait > 0 {
		o.rec.Add(timeline.Span{Phase: timeline.Wait, Name: wait, Start: r.Start, End: r.Start.Add(r.Wait), Lane: lane})
	}
}

// collectiveArgs are what a collective's span shows.
type collectiveArgs struct {
	Op        string `json:"op"`
	Bytes     int    `json:"bytes"`
	Algorithm string `json:"algorithm"`
	Transport string `json:"transport"`
	Last      string `json:"last"`
	MarginUS  int64  `json:"margin_us"`
	Error     string `json:"error,omitempty"`
}

// lane returns the first lane whose spans all end by r's start, making
// r's end its last, and the name of r's wait.
func (o *observer) lane(r collective.Record) (int, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	wait, ok := o.waitNames[r.Last.Name]
	if !ok {
		wait = "wait for " + r.Last.Name
		o.waitNames[r.Last.Name] = wait
	}
	for i, last := range o.lanes {
		if !last.After(r.Start) {
			o.lanes[i] = r.End
			return i + 1, wait
		}
	}
	o.lanes = append(o.lanes, r.End)
	return len(o.lanes), wait
}

// step records a step that ran from begin to end on b, having waited
// waited for its peers; the metrics count it when it trains.
func (o *observer) step(b *dataset.Batch, begin, end time.Time, waited time.Duration, trains bool) {
	asked, got := b.InputTime()
	if asked.IsZero() {
		asked, got = begin, begin
	}
	o.mu.Lock()
	o.steps++
	n := o.steps
	wall := end.Sub(asked)
	if !o.lastEnd.IsZero() && o.lastEnd.Before(asked) {
		wall = end.Sub(o.lastEnd)
	}
	o.lastEnd = end
	input := got.Sub(asked)
	if len(o.inputs) == maxWindow { // no CheckStragglers for long: keep the recent half
		o.inputs = append(o.inputs[:0], o.inputs[maxWindow/2:]...)
		o.computes = append(o.computes[:0], o.computes[maxWindow/2:]...)
	}
	o.inputs = append(o.inputs, input)
	o.computes = append(o.computes, max(0, wall-input-waited))
	o.mu.Unlock()
	if o.m != nil && trains {
		o.m.Step(b.LocalCount(), end.Sub(asked), end)
		o.m.InputWaitSeconds.Observe(input.Seconds())
	}
	if o.rec != nil {
		name := "step " + strconv.FormatInt(n, 10)
		o.rec.Add(timeline.Span{Phase: timeline.Step, Name: name, Start: asked, End: end, Args: stepArgs{b.LocalCount()}})
		o.rec.Add(timeline.Span{Phase: timeline.Input, Name: "input", Start: asked, End: got})
		// Compute is all of the step after its input, as the straggler
		// window counts it: callbacks between the two included.
		o.rec.Add(timeline.Span{Phase: timeline.Compute, Name: "run", Start: got, End: end})
	}
}

// stepArgs are what a step's span shows.
type stepArgs struct {
	Examples int `json:"examples"`
}

// window returns the medians of the steps since the last window, and
// starts the next.
func (o *observer) window() straggler.Window {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := straggler.Window{Input: median(o.inputs), Compute: median(o.computes)}
	o.inputs, o.computes = o.inputs[:0], o.computes[:0]
	return w
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// close writes the trace, if asked, and stops serving the metrics.
func (o *observer) close() error {
	if o == nil {
		return nil
	}
	if o.stopServe != nil {
		o.stopServe()
	}
	if o.tracePath == "" {
		return nil
	}
	var buf bytes.Buffer
	if err := timeline.Write(&buf, o.rec, o.task, os.Getpid()); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(o.tracePath, buf.Bytes()); err != nil {
		return fmt.Errorf("multiworker: write the timeline to %s: %w", o.tracePath, err)
	}
	return nil
}

// Run runs step on batch, as strategy.Strategy's Run, and records the
// step on the worker's timeline and metrics when it has them.
func (s *Strategy) Run(ctx context.Context, step strategy.Step, batch *dataset.Batch) (strategy.Result, error) {
	res, err := s.observedRun(ctx, step, batch)
	if err == nil && s.localSGD != nil {
		err = s.localSGD.after(ctx, s, res)
	}
	return res, err
}

// observedRun runs step on batch and records the step.
func (s *Strategy) observedRun(ctx context.Context, step strategy.Step, batch *dataset.Batch) (strategy.Result, error) {
	o := s.obs
	if o == nil || batch == nil {
		return s.engine.Run(ctx, step, batch)
	}
	begin := time.Now()
	before := s.CollectiveStats().PeerWait
	res, err := s.engine.Run(ctx, step, batch)
	if err == nil {
		t, ok := step.(interface{ Trains() bool })
		o.step(batch, begin, time.Now(), s.CollectiveStats().PeerWait-before, ok && t.Trains())
	}
	return res, err
}

// Timeline returns the Recorder this worker's spans go to, nil without
// one (see WithTimeline).
func (s *Strategy) Timeline() *timeline.Recorder {
	if s.obs == nil {
		return nil
	}
	return s.obs.rec
}

// Monitoring returns this worker's metrics, nil without them (see
// WithMonitoring).
func (s *Strategy) Monitoring() *monitoring.Metrics {
	if s.obs == nil {
		return nil
	}
	return s.obs.m
}

// CheckStragglers compares the workers' steps since the last call: every
// worker's median input wait and compute time (a step's time but its
// input and its wait for peers), gathered from all of them. It is a
// collective: every worker calls it after the same steps, as Fit does
// every few steps. It returns the workers d names (it keeps the scores of
// the calls before), sets each worker's straggler score in the metrics,
// and the chief logs a warning for each straggler. On TensorFlow's
// collectives, or with one worker, it compares nothing and returns nil.
func (s *Strategy) CheckStragglers(ctx context.Context, d *straggler.Detector) ([]straggler.Straggler, error) {
	if s.group == nil || s.obs == nil {
		return nil, nil
	}
	w := s.obs.window()
	mine := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(w.Input)), uint64(w.Compute))
	all, err := s.group.AllGather(ctx, "tfdist_straggler_window", collective.Int64, mine)
	if err != nil {
		return nil, fmt.Errorf("multiworker: task %s: gather the workers' step times: %w", s.task, errors.Join(err, strategy.ErrCannotContinue))
	}
	windows := make([]straggler.Window, len(all))
	for i, b := range all {
		if len(b) != 16 {
			return nil, fmt.Errorf("multiworker: task %s: worker %d sent %d bytes of step times, expected 16", s.task, i, len(b))
		}
		windows[i] = straggler.Window{Input: time.Duration(binary.LittleEndian.Uint64(b)), Compute: time.Duration(binary.LittleEndian.Uint64(b[8:]))}
	}
	if m := s.obs.m; m != nil {
		for _, sc := range straggler.Scores(windows) {
			m.StragglerScore.WithLabelValues(s.workers[sc.Worker].String()).Set(sc.Relative)
		}
	}
	found := d.Observe(windows)
	if s.IsChief() {
		for _, st := range found {
			s.log.Warn("straggler", zap.String("straggler", s.workers[st.Worker].String()), zap.String("host", s.hostOf(st.Worker)),
				zap.Float64("score", st.Relative), zap.String("slow_phase", st.Phase), zap.Int("windows", st.Windows),
				zap.Duration("input", windows[st.Worker].Input), zap.Duration("compute", windows[st.Worker].Compute))
		}
	}
	return found, nil
}

// hostOf returns the host of worker w's address.
func (s *Strategy) hostOf(w int) string {
	addr := s.group.Members()[w].Addr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}
