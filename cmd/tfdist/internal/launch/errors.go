package launch

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/tfdist/tfdist/cluster"
)

// TaskError reports the task whose exit ended an attempt.
type TaskError struct {
	Task cluster.Task
	// Attempt is the TFDIST_RESTART the task ran with: 0 on its first run,
	// n after n restarts, of the whole cluster and of this task alone.
	Attempt int
	// ExitCode is the task's exit status, or -1 when a signal killed it.
	ExitCode int
	// Signal is the signal that killed the task, 0 when it exited.
	Signal syscall.Signal
	// Why says, for a task whose exit is a failure whatever its status (a
	// parameter server that stopped serving), why.
	Why string
	// Output holds the last lines the task wrote, at most 10 of stdout and
	// 10 of stderr, merged in the order the launcher read them, each cut to
	// 300 bytes.
	Output []string
}

func newTaskError(t cluster.Task, attempt int, state *os.ProcessState, why string) *TaskError {
	e := &TaskError{Task: t, Attempt: attempt, ExitCode: state.ExitCode(), Why: why}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal = ws.Signal()
	}
	return e
}

// Error says which task ended how, e.g. "worker:1 exited with status 3",
// followed by its last lines of output, one per line, indented.
func (e *TaskError) Error() string {
	var b strings.Builder
	b.WriteString(e.Task.String())
	if e.Signal != 0 {
		fmt.Fprintf(&b, " was killed by signal %d (%v)", int(e.Signal), e.Signal)
	} else {
		fmt.Fprintf(&b, " exited with status %d", e.ExitCode)
	}
	if e.Why != "" {
		b.WriteString(" " + e.Why)
	}
	if e.Attempt > 0 {
		fmt.Fprintf(&b, " (after %d restart%s)", e.Attempt, plural(e.Attempt))
	}
	if len(e.Output) > 0 {
		b.WriteString("; its last lines:\n\t" + strings.Join(e.Output, "\n\t"))
	}
	return b.String()
}

// TimeoutError reports a run that outlasted WithTimeout.
type TimeoutError struct {
	Timeout time.Duration
	Running []cluster.Task // the tasks still running when time was up
}

// Error names the timeout and the tasks that were still running.
func (e *TimeoutError) Error() string {
	names := make([]string, len(e.Running))
	for i, t := range e.Running {
		names[i] = t.String()
	}
	if len(names) == 0 {
		return fmt.Sprintf("timed out after %v", e.Timeout)
	}
	return fmt.Sprintf("timed out after %v with %s still running", e.Timeout, strings.Join(names, ", "))
}

// InterruptedError reports a run stopped by a signal given to Signal.
type InterruptedError struct{ Signal os.Signal }

// Error names the signal.
func (e *InterruptedError) Error() string {
	return fmt.Sprintf("interrupted by %v; every task was stopped", e.Signal)
}

// ExitCode maps Run's result to the exit status a launcher process should
// end with: 0 for nil; a failed task's own status (128+n for a task killed by
// signal n, 1 for a server that exited with 0 too early); 124 for a timeout,
// as timeout(1); 128+n after signal n; 1 for anything else.
func ExitCode(err error) int {
	var (
		te *TaskError
		to *TimeoutError
		ie *InterruptedError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &te):
		switch {
		case te.Signal != 0:
			return 128 + int(te.Signal)
		case te.ExitCode > 0:
			return te.ExitCode
		}
		return 1
	case errors.As(err, &to):
		return 124
	case errors.As(err, &ie):
		if s, ok := ie.Signal.(syscall.Signal); ok {
			return 128 + int(s)
		}
		return 1
	}
	return 1
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
