package paramserver

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// A worker killed and restarted at once at its address, as tfdist launch
// and Kubernetes restart one, before the heartbeat finds it dead: the run it
// was doing, which TensorFlow's client retries against the new server, ends
// as a worker failure and runs again; no step is lost or applied twice.
func TestWorkerRestartedAtOnceLosesNoStep(t *testing.T) {
	spec, tasks := childCluster(t, 2, 2)
	ctx := testContext(t, 3*time.Minute)
	s, err := New(ctx, chiefResolver(t, spec), WithStartupTimeout(time.Minute), WithStepTimeout(30*time.Second),
		WithThreads(1, 2), WithLogger(zaptest.NewLogger(t)))
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 32); return err }))
	train, _ := buildDigits(t, s, m, optimizer.NewSGD(optimizer.Constant(0.1)))
	c := newCoordinator(t, s, WithProbeInterval(50*time.Millisecond, 500*time.Millisecond))
	trainData, _ := digitsData(t)
	input := perWorkerDigits(t, c, trainData, 32)

	const steps = 600
	var rvs []*RemoteValue
	for range steps {
		rv, err := c.Schedule(train, input)
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	w1 := cluster.Task{Type: cluster.Worker, Index: 1}
	for kill := 1; kill <= 2; kill++ {
		waitFor(t, time.Minute, "steps before the kill", func() bool { return c.Stats().Succeeded >= 150*kill })
		tasks[w1].kill()
		tasks[w1].start()
	}
	require.NoError(t, c.Join(ctx))
	for i, rv := range rvs {
		require.NoError(t, rv.Wait(ctx), "step %d", i)
	}
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, steps, applied, "every step's update applied exactly once")
	st := c.Stats()
	assert.GreaterOrEqual(t, st.WorkerFailures, 1)
	t.Logf("stats %+v", st)
}

func TestWorkerFailureKinds(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&tfrt.Error{Code: tfrt.Unavailable, Msg: "Connection reset by peer"}, true},
		{&tfrt.Error{Code: tfrt.NotFound, Msg: "Session 32b5dac9fee346ff is not found."}, true},
		{&tfrt.Error{Code: tfrt.NotFound, Msg: "Resource localhost/mlp/kernel/N10tensorflow3VarE does not exist."}, false},
		{&tfrt.Error{Code: tfrt.InvalidArgument, Msg: "Session 1 is not found"}, false},
	} {
		assert.Equal(t, c.want, workerFailure(c.err), "%v", c.err)
	}
}

// A task's refusal of a run's request that TensorFlow's client sent a
// second time is retried even though every task answers probes, as a
// worker's refusal (ABORTED) and as a ps task's (UNKNOWN), the two that
// soaks met; other aborted runs of a worker that answers are the step's
// own errors.
func TestRepeatedRequestIsRetried(t *testing.T) {
	for _, repeated := range []*tfrt.Error{
		{Code: tfrt.Aborted, Msg: `From /job:worker/replica:0/task:1:
The same RunGraph (Worker) request was received twice. graph_handle: "0000000000000002" step_id: 134919387177274760`},
		{Code: tfrt.Unknown, Msg: `From /job:ps/replica:0/task:0:
The same RunGraph (Worker) request was received twice. graph_handle: "0000000000000001" step_id: 81719755830285159`},
	} {
		assert.True(t, repeatedRequest(repeated), "%v", repeated)
	}
	assert.False(t, repeatedRequest(&tfrt.Error{Code: tfrt.Aborted, Msg: "Step was cancelled by an explicit call to `Session::Close()`."}))
	assert.False(t, repeatedRequest(errors.New("the request was received twice")), "not TensorFlow's")
}
