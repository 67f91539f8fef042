// Package soak runs the digits classifier for a long time under a strategy,
// as a user's job runs for hours, and watches every process of it: OS
// threads, resident memory, open file descriptors and, as the classifier
// reports them, goroutines and the Go heap. A run fails when a process
// exits with an error or when any figure grows beyond its bound; the tables
// show the figures at a tenth of the run and at its end. It reads /proc, so
// it runs on Linux.
package soak

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
	"github.com/tfdist/tfdist/logging"
)

// Setup is one way to run the classifier: a cluster shape and its flags.
type Setup struct {
	Name   string
	Launch []launch.Option
	Args   []string
	// MaxSteps, when set, caps the run's steps.
	MaxSteps int
	// ScaleEvery, when set, changes an elastic job's membership this
	// often: one worker fewer, then one more (launch.Launcher.Scale).
	// Processes then come and go; only those that lived through most of the
	// run are judged.
	ScaleEvery time.Duration
}

// StepsOf returns the steps a run asked for steps takes under s.
func (s Setup) StepsOf(steps int) int {
	if s.MaxSteps > 0 {
		return min(steps, s.MaxSteps)
	}
	return steps
}

// Setups are the strategies a soak run covers, in order: the default
// strategy, Mirrored on 2 logical CPUs, MultiWorkerMirrored on 2 workers of
// 2 logical CPUs each on tfdist's collective engine and on TensorFlow's
// collectives, and parameter-server training with a chief, 2 workers and 1
// ps task. TensorFlow's distributed sessions refuse a step as a repeated
// request about once in tens of thousands (docs/architecture.md), so the
// run on its collectives stops at 10,000 steps, where that is rare. Three
// more, which -strategies must name, soak the gradient paths of the
// engine: "robust", 3 workers whose votes a trimmed mean combines,
// "topk", 2 workers of 2 logical CPUs sending TopK(0.01) gradients, and
// "wide", 2 workers of 2 logical CPUs training 1,024 hidden units, whose
// gradients' all-reduce is large enough for each worker to read its
// chunks from the other's memory, "pushed", the same with 16,384
// hidden units, whose first layer's gradient (4 MiB) the workers push
// into each other's results, and "elastic", an elastic job of 2 to 3
// workers whose membership changes every second.
func Setups() []Setup {
	return []Setup{
		{Name: "default", Args: []string{"-strategy", "default"}},
		{Name: "mirrored", Args: []string{"-strategy", "mirrored", "-devices", "2"}},
		{Name: "multiworker", Launch: []launch.Option{launch.WithWorkers(2)},
			Args: []string{"-strategy", "multiworker", "-devices", "2"}},
		{Name: "multiworker-tensorflow", Launch: []launch.Option{launch.WithWorkers(2)},
			Args: []string{"-strategy", "multiworker", "-devices", "2", "-communication", "tensorflow"}, MaxSteps: 10_000},
		{Name: "ps", Launch: []launch.Option{launch.WithChief(true), launch.WithWorkers(2), launch.WithPS(1)},
			Args: []string{"-strategy", "ps"}},
		{Name: "robust", Launch: []launch.Option{launch.WithWorkers(3)},
			Args: []string{"-strategy", "multiworker", "-global-batch", "96", "-aggregation", "trimmed_mean(1)"}},
		{Name: "topk", Launch: []launch.Option{launch.WithWorkers(2)},
			Args: []string{"-strategy", "multiworker", "-devices", "2", "-compression", "topk(0.01)"}},
		{Name: "wide", Launch: []launch.Option{launch.WithWorkers(2)},
			Args: []string{"-strategy", "multiworker", "-devices", "2", "-hidden", "1024"}},
		{Name: "pushed", Launch: []launch.Option{launch.WithWorkers(2)},
			Args: []string{"-strategy", "multiworker", "-devices", "2", "-hidden", "16384"}},
		{Name: "elastic", Launch: []launch.Option{launch.WithElastic(2, 3), launch.WithWorkers(3)},
			Args: []string{"-strategy", "elastic", "-global-batch", "48"}, ScaleEvery: time.Second},
	}
}

// Lookup returns the setup named name, or an error that lists the names.
func Lookup(name string) (Setup, error) {
	var names []string
	for _, s := range Setups() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Setup{}, fmt.Errorf("strategy %q: expected one of %v", name, names)
}

// Bounds are what a process may hold, how much it may grow between a
// tenth of the run and its end, and how long a step may take.
type Bounds struct {
	MaxThreads         int     // OS threads, at any sample
	MaxRSSGrowth       float64 // resident memory, as a fraction of its value at a tenth of the run
	MaxFDGrowth        int     // open file descriptors
	MaxGoroutineGrowth int     // goroutines, where the program reports them
	MaxStepRatio       float64 // the slowest step, as a multiple of the median step (0: unbounded)
}

// DefaultBounds are the bounds of the soak test: at most 300 threads, 10%
// more memory, 2 more file descriptors, 10 more goroutines, no step
// slower than 5 times the median.
var DefaultBounds = Bounds{MaxThreads: 300, MaxRSSGrowth: 0.10, MaxFDGrowth: 2, MaxGoroutineGrowth: 10, MaxStepRatio: 5}

// Options configure Run.
type Options struct {
	// Classifier is the path of the internal/cmd/digits binary.
	Classifier string
	// Steps is the number of training steps.
	Steps int
	// Interval is the time between samples (default 1 s).
	Interval time.Duration
	// Bounds are the limits every process must keep.
	Bounds Bounds
	// Timeout bounds the whole run (default: none).
	Timeout time.Duration
	// Output receives the tasks' prefixed output (default: discarded; the
	// last lines of a failed run are in its report).
	Output io.Writer
	// Logger receives the launcher's events.
	Logger *zap.Logger
}

// Run runs setup for o.Steps steps, samples its processes every o.Interval
// and judges them against o.Bounds. The error is for a run that could not
// be started; a run that failed or broke a bound says so in its Report.
func Run(ctx context.Context, setup Setup, o Options) (*Report, error) {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Steps < 1 {
		return nil, fmt.Errorf("steps: %d, expected at least 1", o.Steps)
	}
	o.Steps = setup.StepsOf(o.Steps)
	w := newWatcher(o.Output)
	args := append([]string{o.Classifier}, setup.Args...)
	args = append(args, "-steps", fmt.Sprint(o.Steps), "-json", "-log-every", fmt.Sprint(max(o.Steps/10, 1)),
		"-stats-every", o.Interval.String())
	opts := append([]launch.Option{
		launch.WithOutput(w, w), launch.WithLogger(logging.OrNop(o.Logger)), launch.WithTimeout(o.Timeout),
		launch.WithOnStart(w.started),
	}, setup.Launch...)
	l, err := launch.New(args, opts...)
	if err != nil {
		return nil, fmt.Errorf("soak %s: %w", setup.Name, err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	var scale <-chan time.Time
	if setup.ScaleEvery > 0 {
		t := time.NewTicker(setup.ScaleEvery)
		defer t.Stop()
		scale = t.C
	}
	delta := -1
	for {
		select {
		case <-tick.C:
			w.sample(time.Since(start))
		case <-scale:
			l.Scale(delta)
			delta = -delta
		case err := <-done:
			r := &Report{Setup: setup.Name, Steps: o.Steps, Elapsed: time.Since(start), Err: err,
				Processes: w.processes(), Result: w.result, Tail: w.tail(), transient: setup.ScaleEvery > 0}
			r.judge(o.Bounds)
			return r, nil
		}
	}
}

// watcher follows the processes of a run: their pids as the launcher starts
// them, their samples, and what they print.
type watcher struct {
	lines *lineWriter

	mu     sync.Mutex
	procs  []*Process
	byTask map[cluster.Task]*Process // the newest process of each task
	result *resultLine
}

func newWatcher(out io.Writer) *watcher {
	w := &watcher{byTask: map[cluster.Task]*Process{}}
	w.lines = newLineWriter(out, w.line)
	return w
}

func (w *watcher) Write(p []byte) (int, error) { return w.lines.Write(p) }

func (w *watcher) started(t cluster.Task, attempt, pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := &Process{Task: t, Attempt: attempt, PID: pid, goroutines: -1, heap: -1}
	w.procs = append(w.procs, p)
	w.byTask[t] = p
}

// line takes one line of a task's output: a stats line or the result.
func (w *watcher) line(task cluster.Task, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n, heap, ok := parseStats(text); ok {
		if p := w.byTask[task]; p != nil {
			p.goroutines, p.heap = n, heap
		}
		return
	}
	if r, ok := parseResult(task, text); ok && (w.result == nil || r.Chief) {
		w.result = r
	}
}

func (w *watcher) sample(at time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.procs {
		if p.gone {
			continue
		}
		s, err := readProc(p.PID)
		if err != nil {
			p.gone = true // exited; its last sample stands
			continue
		}
		s.At, s.Goroutines, s.GoHeap = at, p.goroutines, p.heap
		p.Samples = append(p.Samples, s)
	}
}

func (w *watcher) processes() []*Process {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*Process(nil), w.procs...)
}

func (w *watcher) tail() []string { return w.lines.tail() }
