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
// queue) returns soon after its context's deadline, wrapping it; the
// session then refuses every run at once, and closes at once.
func TestRunEndsAtItsDeadline(t *testing.T) {
	for _, st := range stepThreads {
		t.Run(st.name, func(t *testing.T) { testRunEndsAtItsDeadline(t, st.opts) })
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
	start := time.Now()
	_, err := sess.Run(ctx, nil, []tf.Output{x}, nil)
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrInterrupted)
	assert.Less(t, took, 200*time.Millisecond+interruptGrace, "TensorFlow cancelled the dequeue")

	start = time.Now()
	_, err = sess.Run(context.Background(), nil, []tf.Output{one}, nil)
	require.ErrorIs(t, err, ErrInterrupted, "the session runs nothing more")
	assert.ErrorContains(t, err, "context deadline exceeded")
	require.NoError(t, sess.Close())
	assert.Less(t, time.Since(start), time.Second)
}

// A run that TensorFlow cannot stop (computation: its executor finishes a
// cancelled step's kernels) still returns within about a second of its
// context's cancellation, before the computation ends; Close waits for it.
func TestRunOfComputationReturnsWhenCancelled(t *testing.T) {
	for _, st := range stepThreads {
		t.Run(st.name, func(t *testing.T) { testRunOfComputationReturnsWhenCancelled(t, st.opts) })
	}
}

func testRunOfComputationReturnsWhenCancelled(t *testing.T, opts []ConfigOption) {
	s := op.NewScope()
	m := op.RandomUniform(s.SubScope("m"), op.Const(s.SubScope("shape"), []int32{500, 500}), tf.Float)
	y := m
	for range 600 {
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
	assert.Less(t, took, 100*time.Millisecond+interruptGrace+time.Second, "the whole run takes %v", full)
	require.NoError(t, sess.Close())
	t.Logf("the run returned after %v; it takes %v", took, full)
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
