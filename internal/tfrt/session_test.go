package tfrt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// newSession opens a session on the graph s built, with one thread per
// pool and opts, closed when the test ends.
func newSession(t *testing.T, s *op.Scope, opts ...ConfigOption) *Session {
	t.Helper()
	g, err := s.Finalize()
	require.NoError(t, err)
	so, err := SessionOptions("", append([]ConfigOption{WithThreads(1, 1)}, opts...)...)
	require.NoError(t, err)
	sess, err := NewSession(g, so)
	require.NoError(t, err, "graft's layout is the one Session reads")
	t.Cleanup(func() { sess.Close() })
	return sess
}

// stepThreads are the two ways a session runs a step's ops: on the
// inter-op pool, and on the thread that calls Run.
var stepThreads = []struct {
	name string
	opts []ConfigOption
}{{"pool", nil}, {"caller", []ConfigOption{WithStepsOnCallerThread()}}}

// A run blocked in an op that TensorFlow cancels (a dequeue from an empty
// queue) returns after its context's deadline, wrapping it, instead of
// waiting for the dequeue (forever); the session then refuses every run,
// and Close, which waits for the runs in progress, returns: TensorFlow
// cancelled the dequeue.
func TestRunEndsAtItsDeadline(t *testing.T) {
	for _, st := range stepThreads {
		t.Run(st.name, func(t *testing.T) { testRunEndsAtItsDeadline(t, st.opts) })
	}
}

// forever bounds a wait that would otherwise never end: far longer than
// any step of these tests takes on a loaded machine, so that only a wait
// that does not end fails.
const forever = 60 * time.Second

// returnsWithin calls f and fails the test, without waiting for f, if f
// has not returned after d.
func returnsWithin(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v", what, d)
	}
}

func testRunEndsAtItsDeadline(t *testing.T, opts []ConfigOption) {
	s := op.NewScope()
	q := op.FIFOQueueV2(s.SubScope("q"), []tf.DataType{tf.Float})
	x := op.QueueDequeueV2(s.SubScope("dequeue"), q, []tf.DataType{tf.Float})[0]
	one := op.Const(s.SubScope("one"), float32(1))
	sess := newSession(t, s, opts...)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var err error
	returnsWithin(t, forever, "a run on an empty queue past its deadline", func() {
		_, err = sess.Run(ctx, nil, []tf.Output{x}, nil)
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrInterrupted)

	returnsWithin(t, forever, "a run on the interrupted session", func() {
		_, err = sess.Run(context.Background(), nil, []tf.Output{one}, nil)
	})
	require.ErrorIs(t, err, ErrInterrupted, "the session runs nothing more")
	assert.ErrorContains(t, err, "context deadline exceeded")
	// Close waits for the dequeue's run: only TensorFlow's cancellation
	// of the dequeue ends it.
	returnsWithin(t, forever, "TensorFlow cancelled the dequeue: Close", func() { err = sess.Close() })
	require.NoError(t, err)
}

// A run that TensorFlow cannot stop (computation: its executor finishes a
// cancelled step's kernels) still returns soon after its context's
// cancellation, well before the computation ends; Close waits for it. The
// computation (about 3 s) is long enough that its remainder after the
// cancellation outlasts the run's grace to return (interruptGrace) on a
// fast CPU too.
func TestRunOfComputationReturnsWhenCancelled(t *testing.T) {
	for _, st := range stepThreads {
		t.Run(st.name, func(t *testing.T) { testRunOfComputationReturnsWhenCancelled(t, st.opts) })
	}
}

func testRunOfComputationReturnsWhenCancelled(t *testing.T, opts []ConfigOption) {
	s := op.NewScope()
	m := op.RandomUniform(s.SubScope("m"), op.Const(s.SubScope("shape"), []int32{500, 500}), tf.Float)
	y := m
	for range 2400 {
		y = op.Tanh(s.SubScope("tanh"), op.MatMul(s.SubScope("matmul"), y, m))
	}
	sess := newSession(t, s, opts...)
	start := time.Now()
	_, err := sess.Run(context.Background(), nil, []tf.Output{y}, nil)
	require.NoError(t, err)
	full := time.Since(start)

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	_, err = sess.Run(ctx, nil, []tf.Output{y}, nil)
	took := time.Since(start)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, ErrInterrupted)
	// The computation goes on in the background (seconds); Close waits for
	// it, so the time to Close's return is the computation's, measured under
	// the same load as the run's return.
	require.NoError(t, sess.Close())
	ran := time.Since(start)
	assert.Less(t, took, ran/2, "the run returned after %v; its computation ran for %v (uncancelled: %v)", took, ran, full)
	t.Logf("the run returned after %v; its computation ran for %v (uncancelled: %v)", took, ran, full)
}

// Without a deadline or cancellation, Run is graft's.
func TestRunWithoutAnEnd(t *testing.T) {
	s := op.NewScope()
	c := op.Const(s.SubScope("c"), int32(7))
	sess := newSession(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), ctx} {
		out, err := sess.Run(ctx, nil, []tf.Output{c}, nil)
		require.NoError(t, err)
		assert.Equal(t, int32(7), out[0].Value())
	}
}
