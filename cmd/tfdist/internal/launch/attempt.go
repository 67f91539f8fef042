package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
)

// clusterRun is one attempt of the cluster: its processes, and what its
// event loop knows of them.
type clusterRun struct {
	l       *Launcher
	attempt int
	spec    cluster.ClusterSpec
	out     *syncWriters
	exits   chan exitEvent
	procs   []*proc // the newest process of each task, in task order

	restarts []int         // restarts of each task alone in this attempt
	pending  []*time.Timer // each task's restart being waited for, or nil
	due      chan int      // positions of the tasks whose restart delay is over

	// An elastic job: its rendezvous's end (nil once received), whether it
	// finished, and the exit of the last worker not replaced.
	served      <-chan error
	finished    bool
	lastFailure error

	running   int
	result    error
	failed    *proc // the process whose exit result reports
	stopping  bool
	killTimer <-chan time.Time
}

// attempt runs the cluster once.
func (l *Launcher) attempt(ctx context.Context, attempt int) error {
	tasks := l.Tasks()
	var ports []int
	if l.net == nil {
		var err error
		if ports, err = l.ports(l.numPorts()); err != nil {
			return err
		}
	}
	addrs := map[cluster.TaskType][]string{}
	for i, t := range tasks {
		var addr string
		if l.net != nil {
			addr = l.hostAddr(i)
		} else {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i]))
		}
		addrs[t.Type] = append(addrs[t.Type], addr)
	}
	spec, err := cluster.NewClusterSpec(addrs)
	if err != nil {
		return fmt.Errorf("build the cluster spec: %w", err)
	}
	l.log.Info("starting the cluster", zap.Int("attempt", attempt), zap.Stringer("cluster", spec),
		zap.Stringer("fingerprint", spec.Fingerprint()))
	if l.metrics {
		l.assignMetrics(tasks, ports[len(tasks):])
	}

	r := l.newRun(attempt, spec, len(tasks))
	r.restarts, r.pending = make([]int, len(tasks)), make([]*time.Timer, len(tasks))
	defer r.end()
	for i, t := range tasks {
		p, err := l.start(spec, t, i, attempt, r.out, r.exits)
		if err != nil {
			return fmt.Errorf("start %s: %w", t, err)
		}
		r.procs = append(r.procs, p)
		r.running++
	}
	return r.wait(ctx)
}

// newRun returns the run of an attempt of up to n tasks.
func (l *Launcher) newRun(attempt int, spec cluster.ClusterSpec, n int) *clusterRun {
	return &clusterRun{l: l, attempt: attempt, spec: spec, out: &syncWriters{stdout: l.stdout, stderr: l.stderr},
		exits: make(chan exitEvent, n), due: make(chan int, n)}
}

// wait runs the attempt's event loop until every process has exited.
func (r *clusterRun) wait(ctx context.Context) error {
	ctxDone := ctx.Done()
	for r.running > 0 || slices.ContainsFunc(r.pending, func(t *time.Timer) bool { return t != nil }) {
		select {
		case ev := <-r.exits:
			r.exited(ev)
		case i := <-r.due:
			r.restart(i)
		case <-ctxDone:
			ctxDone = nil
			var reason error = ctx.Err()
			if context.Cause(ctx) == errTimeout {
				reason = &TimeoutError{Timeout: r.l.timeout, Running: runningTasks(r.procs)}
			}
			r.l.log.Warn("stopping the cluster", zap.Error(reason))
			r.stop(reason, nil, syscall.SIGTERM)
		case sig := <-r.l.sigs:
			r.signaled(sig)
		case err := <-r.served:
			r.rendezvousEnded(err)
		case d := <-r.l.scales:
			r.scale(d)
		case <-r.killTimer:
			r.killTimer = nil
			r.l.log.Warn("grace period over: killing the tasks still running",
				zap.Duration("grace", r.l.grace), zap.Stringers("tasks", runningTasks(r.procs)))
			r.killAll()
		}
	}
	return r.result
}

// end stops the restarts still waited for and sweeps every process; the
// result, if a task's exit, then gets that task's last lines.
func (r *clusterRun) end() {
	r.cancelRestarts()
	sweep(r.procs, r.exits)
	if te, ok := r.result.(*TaskError); ok && r.failed != nil {
		te.Output = r.failed.tail.last()
	}
}

// exited handles a process's exit.
func (r *clusterRun) exited(ev exitEvent) {
	r.running--
	ev.p.done = true
	r.l.log.Info("task exited", zap.Stringer("task", ev.p.task), zap.Stringer("status", ev.state), zap.Int("attempt", ev.p.start))
	if r.stopping {
		return
	}
	if reason, end := r.judge(ev); end {
		r.stop(reason, ev.p, syscall.SIGTERM)
	}
}

// stop ends the attempt with reason, the exit of failed if not nil: every
// process gets sig, and SIGKILL after the grace period.
func (r *clusterRun) stop(reason error, failed *proc, sig syscall.Signal) {
	if r.stopping {
		return
	}
	r.stopping, r.result, r.failed = true, reason, failed
	r.cancelRestarts()
	for _, p := range r.procs {
		if !p.done {
			signalGroup(p.pgid, sig)
		}
	}
	r.killTimer = time.After(r.l.grace)
}

// signaled forwards a signal given to Signal: the first stops the attempt
// with it, a second kills every task.
func (r *clusterRun) signaled(sig os.Signal) {
	if r.stopping {
		r.l.log.Warn("second signal: killing every task", zap.Stringer("signal", sig))
		r.killAll()
		return
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		s = syscall.SIGTERM
	}
	r.l.log.Info("forwarding signal to every task", zap.Stringer("signal", sig))
	r.stop(&InterruptedError{Signal: sig}, nil, s)
}

func (r *clusterRun) killAll() {
	for _, p := range r.procs {
		if !p.done {
			signalGroup(p.pgid, syscall.SIGKILL)
		}
	}
}

// judge decides, for a task that exited while nothing was stopping, whether
// the attempt ends, and with which result; a worker of a parameter-server
// cluster it may restart instead.
func (r *clusterRun) judge(ev exitEvent) (error, bool) {
	t, start := ev.p.task, ev.p.start
	failed := !ev.state.Success()
	if r.l.elastic {
		return r.elasticExited(ev)
	}
	if !r.l.paramServer() {
		if failed {
			return newTaskError(t, start, ev.state, ""), true
		}
		return nil, false
	}
	switch t.Type {
	case cluster.Chief:
		if failed {
			return newTaskError(t, start, ev.state, ""), true
		}
		return nil, true // success: the servers are no longer needed
	case cluster.PS:
		return newTaskError(t, start, ev.state, "while the chief was running (a ps task must serve until the chief ends): "+
			"it held its variables in memory only, so a restarted one would hold none and the chief could not go on; "+
			"it is not restarted alone (--max-restarts restarts the whole cluster, which resumes from its last checkpoint)"), true
	case cluster.Worker:
		return r.workerExited(ev)
	default:
		// An evaluator is no part of the coordinator's training.
		r.l.log.Warn("task exited while the chief was running; the chief carries on without it",
			zap.Stringer("task", t), zap.Stringer("status", ev.state))
		return nil, false
	}
}
