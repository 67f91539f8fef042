package paramserver

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tfdist/tfdist/cluster"
)

// ErrNotChief is returned by New on a ps or worker task once it has served
// the cluster until its context ended: only the chief runs the program's
// training, the other tasks serve. A program that runs on every task exits
// quietly on it.
var ErrNotChief = errors.New("paramserver: this task is not the chief: it served the cluster until the job ended")

// ErrBadCluster is wrapped by the error New and Serve return for a cluster
// that cannot run parameter-server training.
var ErrBadCluster = errors.New("paramserver: unusable cluster")

// ErrDone is returned by Schedule and CreatePerWorkerDataset after
// Coordinator.Done.
var ErrDone = errors.New("paramserver: the coordinator is done")

// ErrEndOfData is the error, wrapping io.EOF, of a step scheduled with a
// PerWorkerDataset once that dataset has ended on every worker, and of
// Schedule with such a dataset. A step that finds its worker's dataset
// ended is not failed but runs on a worker whose dataset still has data;
// only when none has does it resolve with ErrEndOfData. It is not a
// failure: Join does not return it and Stats counts it in EndOfData.
var ErrEndOfData = fmt.Errorf("paramserver: the per-worker dataset has ended on every worker: %w", io.EOF)

// ErrClosed is returned by a Strategy's methods after Close.
var ErrClosed = errors.New("paramserver: the strategy is closed")

// PSFailureError reports that a ps task failed: it no longer answers, or it
// answers but has lost its variables (it was restarted). Training cannot go
// on without the variables it held; every pending and later step fails with
// this error. Restart the job and restore from the last checkpoint.
type PSFailureError struct {
	// Task is the ps task that failed.
	Task cluster.Task
	// Addr is its address.
	Addr string
	// Err is what showed the failure.
	Err error
}

// Error names the ps task and says what to do.
func (e *PSFailureError) Error() string {
	return fmt.Sprintf("paramserver: ps task %s at %s failed: %v; the variables it held are gone: restart the job and restore the last checkpoint",
		e.Task, e.Addr, e.Err)
}

// Unwrap returns the cause.
func (e *PSFailureError) Unwrap() error { return e.Err }

// StepError reports a scheduled step that did not complete: it failed with
// an error of its own (bad input, an op's error), which is not retried, or
// it kept failing as if its worker had died on every attempt.
type StepError struct {
	// Function names the scheduled function.
	Function string
	// Workers lists, in order, the workers the attempts ran on.
	Workers []int
	// Retried reports whether the error came after every allowed attempt
	// failed with a worker failure.
	Retried bool
	// Err is the last attempt's error.
	Err error
}

// Error names the function, the attempts and the cause.
func (e *StepError) Error() string {
	if e.Retried {
		return fmt.Sprintf("paramserver: step %s failed on all %d attempts (workers %v), each as if its worker had died; giving up: %v",
			e.Function, len(e.Workers), e.Workers, e.Err)
	}
	if len(e.Workers) == 0 {
		return fmt.Sprintf("paramserver: step %s: %v", e.Function, e.Err)
	}
	return fmt.Sprintf("paramserver: step %s on worker %d: %v", e.Function, e.Workers[len(e.Workers)-1], e.Err)
}

// Unwrap returns the cause.
func (e *StepError) Unwrap() error { return e.Err }

// NoWorkerError fails the steps that waited for a worker longer than the
// coordinator's WithWorkerWaitTimeout while no worker was up.
type NoWorkerError struct {
	// Workers are the workers that were down, with the last error each
	// gave.
	Workers map[cluster.Task]error
	// Addrs holds each worker's address.
	Addrs map[cluster.Task]string
	// Waited is how long no worker was up.
	Waited time.Duration
}

// Error names every worker and why it is down.
func (e *NoWorkerError) Error() string {
	var parts []string
	for _, t := range sortedTasks(e.Workers) {
		parts = append(parts, fmt.Sprintf("%s at %s (%v)", t, e.Addrs[t], e.Workers[t]))
	}
	return fmt.Sprintf("paramserver: no worker was up for %v: %s; are the worker tasks started, with the same TF_CONFIG?",
		e.Waited.Round(time.Millisecond), strings.Join(parts, "; "))
}

func sortedTasks[V any](m map[cluster.Task]V) []cluster.Task {
	out := make([]cluster.Task, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Index < out[j-1].Index; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
