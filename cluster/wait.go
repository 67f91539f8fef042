package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tfdist/tfdist/internal/probe"
)

// UnreachableError reports the tasks that did not accept connections before
// the wait ended.
type UnreachableError struct {
	// Tasks are the tasks that never answered, in canonical order.
	Tasks []Task
	// Addrs holds each task's address.
	Addrs map[Task]string
	// Waited is how long WaitForTasks waited.
	Waited time.Duration
	// Err is why the wait ended: it wraps the context's error and tells
	// the last dial error.
	Err error
}

// Error names every task that never came up.
func (e *UnreachableError) Error() string {
	parts := make([]string, len(e.Tasks))
	for i, t := range e.Tasks {
		parts[i] = fmt.Sprintf("%s at %s", t, e.Addrs[t])
	}
	return fmt.Sprintf("%d task%s never came up within %v: %s (%v); is every task of the cluster started, with the same TF_CONFIG?",
		len(e.Tasks), plural(len(e.Tasks)), e.Waited.Round(time.Millisecond), strings.Join(parts, ", "), e.Err)
}

// Unwrap returns the cause, so that errors.Is(err,
// context.DeadlineExceeded) holds after a timeout.
func (e *UnreachableError) Unwrap() error { return e.Err }

// WaitForTasks waits until every one of tasks (every task of spec when none
// is given) accepts TCP connections at its address, polling, and returns nil;
// or, when ctx ends first, an *UnreachableError naming the tasks that never
// came up. Give ctx a deadline: a peer that never starts would otherwise be
// waited for forever. Each connection ends as a gRPC client's does, so that
// a task's TensorFlow server closes its end at once rather than after
// gRPC's 120 s handshake deadline.
func WaitForTasks(ctx context.Context, spec ClusterSpec, tasks ...Task) error {
	if len(tasks) == 0 {
		tasks = spec.Tasks()
	}
	addrs := make(map[Task]string, len(tasks))
	for _, t := range tasks {
		a, err := spec.TaskAddress(t.Type, t.Index)
		if err != nil {
			return fmt.Errorf("wait for tasks: %w", err)
		}
		addrs[t] = a
	}
	start := time.Now()
	pending := append([]Task(nil), tasks...)
	slices.SortFunc(pending, compareTasks)
	var lastErr error
	delay := 20 * time.Millisecond
	for {
		var still []Task
		for _, t := range pending {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			err := probe.Server(dctx, addrs[t])
			cancel()
			if err != nil {
				lastErr = err
				still = append(still, t)
			}
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			e := &UnreachableError{Tasks: pending, Addrs: map[Task]string{}, Waited: time.Since(start),
				Err: fmt.Errorf("%w; last dial error: %v", ctx.Err(), lastErr)}
			for _, t := range pending {
				e.Addrs[t] = addrs[t]
			}
			return e
		case <-time.After(delay):
			delay = min(2*delay, 500*time.Millisecond)
		}
	}
}
