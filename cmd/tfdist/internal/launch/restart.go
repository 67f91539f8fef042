package launch

import (
	"fmt"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// workerExited restarts a worker of a parameter-server cluster that exited
// while the chief runs, at the same address, after its backoff delay; or,
// once the worker has had its restarts, ends the attempt with its exit.
func (r *clusterRun) workerExited(ev exitEvent) (error, bool) {
	p := ev.p
	n := r.restarts[p.index]
	if n >= r.l.taskRestarts {
		return newTaskError(p.task, p.start, ev.state, fmt.Sprintf(
			"while the chief was running, and is not restarted again: the limit is %d restart%s per task (--task-restarts)",
			n, plural(n))), true
	}
	r.restarts[p.index]++
	delay := r.l.restartDelay(n + 1)
	// What the task started may outlive it and hold the task's port.
	signalGroup(p.pgid, syscall.SIGKILL)
	i := p.index
	r.pending[i] = time.AfterFunc(delay, func() { r.due <- i })
	r.l.log.Warn("task exited while the chief was running; restarting it at the same address",
		zap.Stringer("task", p.task), zap.Stringer("status", ev.state), zap.Int("restart", n+1),
		zap.Int("task_restarts", r.l.taskRestarts), zap.Duration("delay", delay))
	return nil, false
}

// restart starts again the task at position i, whose restart delay is over.
func (r *clusterRun) restart(i int) {
	if r.stopping || r.pending[i] == nil {
		return // the attempt ended during the delay
	}
	r.pending[i] = nil
	old := r.procs[i]
	old.drain() // its last lines go out before the new process's first
	p, err := r.l.start(r.spec, old.task, i, r.attempt+r.restarts[i], r.out, r.exits)
	if err != nil {
		r.stop(fmt.Errorf("restart %s: %w", old.task, err), nil, syscall.SIGTERM)
		return
	}
	r.procs[i] = p
	r.running++
}

// cancelRestarts stops the restart delays being waited for.
func (r *clusterRun) cancelRestarts() {
	for i, t := range r.pending {
		if t != nil {
			t.Stop()
			r.pending[i] = nil
		}
	}
}

// restartDelay returns the delay before a task's n-th restart: the initial
// backoff, doubled for each restart before, at most the maximum.
func (l *Launcher) restartDelay(n int) time.Duration {
	d := l.backoff
	for range n - 1 {
		if d >= l.maxBackoff {
			break
		}
		d *= 2
	}
	return min(d, l.maxBackoff)
}
