package launch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/fsutil"
	"github.com/tfdist/tfdist/timeline"
)

// prepareTimeline checks that the timeline file can be replaced (a file
// made next to it is renamed over it once the run ends) and makes the
// private directory the tasks write their traces in.
func (l *Launcher) prepareTimeline() error {
	if fi, err := os.Stat(l.timeline); err == nil && fi.IsDir() {
		return fmt.Errorf("timeline %s: a directory, expected a file", l.timeline)
	}
	f, err := os.CreateTemp(filepath.Dir(l.timeline), "."+filepath.Base(l.timeline)+".tmp-")
	if err != nil {
		return fmt.Errorf("timeline %s: cannot be written: %w", l.timeline, err)
	}
	f.Close()
	os.Remove(f.Name())
	dir, err := os.MkdirTemp("", "tfdist-launch-timeline-")
	if err != nil {
		return fmt.Errorf("timeline %s: a directory for the tasks' traces: %w", l.timeline, err)
	}
	if l.timelineDir, err = filepath.Abs(dir); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("timeline %s: a directory for the tasks' traces: %w", l.timeline, err)
	}
	return nil
}

// timelineFile is where task t writes its trace: in an elastic job, each
// of its processes (the start-th) a file of its own.
func (l *Launcher) timelineFile(t cluster.Task, start int) string {
	if l.elastic {
		return filepath.Join(l.timelineDir, fmt.Sprintf("%s-%d-%d.json", t.Type, t.Index, start))
	}
	return filepath.Join(l.timelineDir, fmt.Sprintf("%s-%d.json", t.Type, t.Index))
}

// timelineEnv returns the environment that names the trace file of task
// t's start-th process, if any.
func (l *Launcher) timelineEnv(t cluster.Task, start int) []string {
	if l.timelineDir == "" {
		return nil
	}
	return []string{timeline.Env + "=" + l.timelineFile(t, start)}
}

// gatherTimeline merges the traces the tasks wrote into the timeline file
// and removes their directory. Failing to write the file is the run's
// error when the run succeeded; when it failed, it is logged.
func (l *Launcher) gatherTimeline(runErr error) error {
	defer os.RemoveAll(l.timelineDir)
	err := l.mergeTimeline()
	switch {
	case err == nil:
		return runErr
	case runErr == nil:
		return err
	}
	l.log.Error("timeline not written", zap.String("path", l.timeline), zap.Error(err))
	return runErr
}

// mergeTimeline writes the tasks' traces, in task order, as one trace to
// the timeline file, replacing it atomically; it leaves the file as it
// was when no task wrote a trace.
func (l *Launcher) mergeTimeline() error {
	traces, tasks := l.readTraces()
	if len(traces) == 0 {
		l.log.Warn("no timeline written: no task wrote a trace", zap.String("path", l.timeline))
		return nil
	}
	var buf bytes.Buffer
	if err := timeline.Merge(&buf, traces...); err != nil {
		return fmt.Errorf("timeline %s: %w", l.timeline, err)
	}
	if err := fsutil.WriteFileAtomic(l.timeline, buf.Bytes()); err != nil {
		return fmt.Errorf("timeline %s: %w", l.timeline, err)
	}
	l.log.Info("timeline written: open it in Perfetto (ui.perfetto.dev) or chrome://tracing",
		zap.String("path", l.timeline), zap.Stringers("tasks", tasks))
	return l.printBreakdown(buf.Bytes())
}

// printBreakdown prints each task's share of time in each phase of the
// merged trace.
func (l *Launcher) printBreakdown(trace []byte) error {
	bs, err := timeline.Breakdowns(bytes.NewReader(trace))
	if err == nil {
		fmt.Fprintf(l.stderr, "Where each task's time went (%s):\n", l.timeline)
		err = timeline.WriteTable(l.stderr, bs)
	}
	if err != nil {
		return fmt.Errorf("timeline %s: %w", l.timeline, err)
	}
	return nil
}

// readTraces returns the traces the tasks wrote, in task order, and their
// tasks. It logs the tasks that wrote none (only a program that uses the
// multi-worker strategy writes one) and leaves out, logged, a trace that
// cannot be read, such as one cut short by SIGKILL.
func (l *Launcher) readTraces() ([]io.Reader, []cluster.Task) {
	if l.elastic {
		return l.readElasticTraces()
	}
	var (
		traces      []io.Reader
		tasks, none []cluster.Task
	)
	for _, t := range l.Tasks() {
		b, err := readTrace(l.timelineFile(t, 0))
		if errors.Is(err, fs.ErrNotExist) {
			none = append(none, t)
			continue
		}
		if err != nil {
			l.log.Warn("task's trace left out of the timeline", zap.Stringer("task", t), zap.Error(err))
			continue
		}
		traces = append(traces, bytes.NewReader(b))
		tasks = append(tasks, t)
	}
	if len(none) > 0 {
		l.log.Warn("tasks wrote no trace for the timeline (a program writes one through the multi-worker strategy)",
			zap.Stringers("tasks", none))
	}
	return traces, tasks
}

// readElasticTraces returns the traces the processes of an elastic job
// wrote, in the order of their files' names, and their tasks: a worker
// replaced, or added, wrote one of its own; one killed wrote none.
func (l *Launcher) readElasticTraces() ([]io.Reader, []cluster.Task) {
	names, err := filepath.Glob(filepath.Join(l.timelineDir, "worker-*.json"))
	if err != nil {
		l.log.Warn("the workers' traces cannot be listed", zap.Error(err))
	}
	var (
		traces []io.Reader
		tasks  []cluster.Task
	)
	for _, name := range names {
		var t cluster.Task
		var start int
		if _, err := fmt.Sscanf(filepath.Base(name), "worker-%d-%d.json", &t.Index, &start); err != nil {
			continue
		}
		t.Type = cluster.Worker
		b, err := readTrace(name)
		if err != nil {
			l.log.Warn("worker's trace left out of the timeline", zap.Stringer("task", t), zap.Int("start", start), zap.Error(err))
			continue
		}
		traces = append(traces, bytes.NewReader(b))
		tasks = append(tasks, t)
	}
	return traces, tasks
}

// readTrace reads the trace file at path and checks that it is one, such
// as a trace cut short by SIGKILL is not.
func readTrace(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		err = timeline.Merge(io.Discard, bytes.NewReader(b))
	}
	return b, err
}
