package paramserver

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// A worker killed and restarted at once at its address, as tfdist launch
// and Kubernetes restart one, before the heartbeat finds it dead: the run it
// was doing ends as a worker failure and runs again, and the restarted
// worker, given its part of the graph again, takes steps; no step is lost
// or applied twice.
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
	assert.GreaterOrEqual(t, st.Reconnects, 1, "the restarted worker takes steps again")
	t.Logf("stats %+v", st)
}

// A run is retried on another worker when its worker's server did not
// answer, answered as a new server (it restarted), or stopped answering or
// ran past the step timeout; an error of the step's own ops is the step's.
func TestWorkerFailureKinds(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("run fn_0: %w", taskserver.ErrUnavailable), true},
		{fmt.Errorf("run fn_0: %w", taskserver.ErrRestarted), true},
		{errStepTimeout(30 * time.Second), true},
		{&partition.RunError{Task: "/job:worker/replica:0/task:0", Err: &tfrt.Error{Code: tfrt.InvalidArgument, Msg: "Incompatible shapes"}}, false},
		{&partition.RunError{Task: "/job:ps/replica:0/task:0", Err: &tfrt.Error{Code: tfrt.NotFound, Msg: "Resource localhost/mlp/kernel does not exist."}}, false},
	} {
		assert.Equal(t, c.want, workerFailure(c.err), "%v", c.err)
	}
}
