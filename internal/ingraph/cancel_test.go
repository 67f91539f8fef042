package ingraph_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// A long step (computation, which TensorFlow does not stop at once)
// returns soon after its context's cancellation, wrapping
// context.Canceled, rather than when its computation ends; the engine then
// refuses every call at once, saying why, rather than after the
// computation. "Soon" and "at once" are measured against the step's
// uncancelled time (seconds, longer still on a loaded machine): each must
// take less than half of it. TensorFlow may finish the computation before
// it stops it, so the step is long enough (about 3 s) that its remainder
// after the cancellation (at 300 ms) outlasts the run's grace to return
// (500 ms) on any machine: a shorter step measured only its remainder.
func TestLongStepEndsWithItsContext(t *testing.T) {
	e := local(t, 1, nil)
	step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope()
		m := op.RandomUniform(s.SubScope("m"), op.Const(s.SubScope("shape"), []int32{500, 500}), tf.Float)
		y := m
		for range 2400 {
			y = op.Tanh(s.SubScope("tanh"), op.MatMul(s.SubScope("matmul"), y, m))
		}
		return strategy.Outputs{"y": op.Sum(s.SubScope("sum"), y, op.Const(s.SubScope("axes"), []int32{0, 1}))}, nil
	})
	require.NoError(t, err)
	// A first run sets TensorFlow's executor up, so that the cancellation
	// below comes during the computation, not before it starts.
	start := time.Now()
	_, err = e.RunReplicas(context.Background(), step, feeds(t, 1, 2), 2)
	require.NoError(t, err)
	full := time.Since(start)

	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelled := make(chan time.Time, 1)
	time.AfterFunc(300*time.Millisecond, func() { cancelled <- time.Now(); cancel() })
	_, err = e.RunReplicas(cctx, step, feeds(t, 1, 2), 2)
	returned := time.Now()
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, strategy.ErrCannotContinue)

	_, err = e.RunReplicas(context.Background(), step, feeds(t, 1, 2), 2)
	require.ErrorIs(t, err, strategy.ErrCannotContinue)
	assert.ErrorContains(t, err, "run stopped by its context: context canceled")
	_, err = e.Reduce(context.Background(), strategy.Sum, strategy.PerReplica{tensor(t, float32(1))})
	require.ErrorIs(t, err, strategy.ErrCannotContinue)
	refused := time.Since(returned)

	require.NoError(t, e.Close()) // waits for what TensorFlow still computes
	late := returned.Sub(<-cancelled)
	assert.Less(t, late, full/2, "returned %v after its context was cancelled; the step takes %v", late, full)
	assert.Less(t, refused, full/2, "the refused calls took %v; the step takes %v", refused, full)
	t.Logf("returned %v after the cancellation and refused in %v; the step takes %v, and TensorFlow computed %v after it returned",
		late, refused, full, time.Since(returned))
}
