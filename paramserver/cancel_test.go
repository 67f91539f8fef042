package paramserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/goleak"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/strategy"
)

// stop stops the task with SIGSTOP until the test ends, or resume, and
// waits until every thread of it has stopped: a thread the signal has not
// reached yet could still answer.
func (c *task) stop(t *testing.T) (resume func()) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGSTOP))
	resume = func() { c.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(resume)
	require.Eventually(t, func() bool { return stopped(c.cmd.Process.Pid) }, 10*time.Second, time.Millisecond,
		"every thread of %s stopped", c.task)
	return resume
}

// stopped reports whether every thread of pid is stopped ("T" in
// /proc/PID/task/TID/stat).
func stopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')') // the state follows the command's name
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}

// endsWithin checks that call, given a context whose deadline is 1 s
// away, fails at that deadline, wrapping it, rather than at timeout, the
// strategy's bound on what it waits for: within timeout/2 of the deadline,
// so that only a call that waited for the timeout fails, not a slow
// machine.
func endsWithin(t *testing.T, what string, timeout time.Duration, call func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := call(ctx)
	late := time.Since(deadline)
	require.ErrorIs(t, err, context.DeadlineExceeded, what)
	assert.Less(t, late, timeout/2, "%s returned %v after its deadline, waiting for the %v timeout?", what, late, timeout)
	t.Logf("%s returned %v after its deadline", what, late)
}

// The chief's calls that wait for a stopped ps task (SIGSTOP: it accepts
// connections but answers nothing) — reading a variable, the applied
// steps, a checkpoint's save, waiting for a scheduled step — return at
// their context's deadline, not at the operation or step timeout. Once the
// ps task resumes, the strategy
// works again: the chief's session, which the deadline interrupted, is
// replaced. Closing the strategy while a step waits for a stopped ps task
// interrupts the step, and once everything is closed nothing is left
// running.
func TestStoppedPSHoldsNoCallPastItsContext(t *testing.T) {
	base := goleak.IgnoreCurrent()
	spec, tasks := childCluster(t, 1, 1)
	// The operation timeout is what the chief's calls and Close would wait
	// for: long, so that they are seen not to. The step timeout stays
	// short: what TensorFlow could not cancel of the step on the stopped
	// ps task lasts until it, and the test waits for that to end (below).
	const opTimeout, stepTimeout = 2 * time.Minute, 10 * time.Second
	s, err := New(testContext(t, time.Minute), chiefResolver(t, spec), WithStartupTimeout(time.Minute),
		WithOperationTimeout(opTimeout), WithStepTimeout(stepTimeout), WithThreads(1, 2))
	require.NoError(t, err)
	var v strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		v, err = sc.Variable("v", tf.Float, []int64{2}, strategy.Constant(tensor(t, []float32{1, 1})))
		return err
	}))
	fn, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"v": strategy.MustRead(r, v)}, nil
		})
	require.NoError(t, err)
	saver, err := checkpoint.NewSaver(s)
	require.NoError(t, err)
	c, err := NewCoordinator(s)
	require.NoError(t, err)
	ps := tasks[cluster.Task{Type: cluster.PS, Index: 0}]

	resume := ps.stop(t)
	endsWithin(t, "Value", opTimeout, func(ctx context.Context) error { _, err := s.Value(ctx, v); return err })
	endsWithin(t, "AppliedSteps", opTimeout, func(ctx context.Context) error { _, err := s.AppliedSteps(ctx); return err })
	endsWithin(t, "Save", opTimeout, func(ctx context.Context) error {
		return saver.Save(ctx, filepath.Join(t.TempDir(), "ckpt"), nil)
	})
	resume()
	got, err := s.Value(testContext(t, time.Minute), v)
	require.NoError(t, err, "the strategy goes on once the ps task answers")
	assert.Equal(t, []float32{1, 1}, got.Value())

	waitFor(t, time.Minute, "the worker to connect", func() bool { return c.Stats().Alive[0] })
	resume = ps.stop(t)
	rv, err := c.Schedule(fn, Feed(map[string]*tf.Tensor{"x": tensor(t, []float32{1})}))
	require.NoError(t, err)
	endsWithin(t, "Join", stepTimeout, c.Join)
	start := time.Now()
	require.NoError(t, s.Close())
	// Close waits 5 s at most for the chief's session (a figure of
	// strategy.go, not an option), rather than for the stopped ps task
	// until the operation timeout.
	assert.Less(t, time.Since(start), opTimeout/2, "Close waits 5 s at most for the chief's session, not for the %v operation timeout", opTimeout)
	t.Logf("Close took %v", time.Since(start))
	require.ErrorContains(t, rv.Wait(context.Background()), "the coordinator ended", "Close interrupted the step")
	resume()
	for _, c := range tasks {
		c.kill()
	}
	// What TensorFlow could not cancel on the stopped ps task ends in the
	// background, at the latest at the step timeout.
	deadline := time.Now().Add(stepTimeout + time.Minute)
	for goleak.Find(base) != nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	goleak.VerifyNone(t, base)
}

// New, which checks that every ps task runs ops, returns at its context's
// deadline when a ps task is stopped, not at its startup or operation
// timeout.
func TestStartupWithAStoppedPSEndsWithItsContext(t *testing.T) {
	spec, tasks := childCluster(t, 1, 1)
	require.NoError(t, cluster.WaitForTasks(testContext(t, time.Minute), spec, cluster.Task{Type: cluster.PS, Index: 0}))
	tasks[cluster.Task{Type: cluster.PS, Index: 0}].stop(t)
	const timeout = 2 * time.Minute
	endsWithin(t, "New", timeout, func(ctx context.Context) error {
		s, err := New(ctx, chiefResolver(t, spec), WithStartupTimeout(timeout), WithOperationTimeout(timeout), WithThreads(1, 2))
		if err == nil {
			s.Close()
		}
		return err
	})
}
