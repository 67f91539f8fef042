package paramserver

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap/zaptest"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// A worker killed with SIGKILL in the middle of training: every scheduled
// step still completes, its update applied exactly once (the ps counter
// equals the number of steps), training finishes on the survivor, and the
// killed worker takes steps again once it is restarted.
func TestKilledWorkerLosesNoStepAndRejoins(t *testing.T) {
	spec, tasks := childCluster(t, 2, 2)
	ctx := testContext(t, 3*time.Minute)
	s, err := New(ctx, chiefResolver(t, spec), WithStartupTimeout(time.Minute), WithStepTimeout(30*time.Second), WithThreads(1, 2), WithLogger(zaptest.NewLogger(t)))
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 32); return err }))
	train, eval := buildDigits(t, s, m, optimizer.NewSGD(optimizer.Constant(0.1)))
	c := newCoordinator(t, s, WithProbeInterval(50*time.Millisecond, 500*time.Millisecond))
	trainData, test := digitsData(t)
	input := perWorkerDigits(t, c, trainData, 32)

	// Schedule steps continuously, a few ahead, until told to stop.
	var mu sync.Mutex
	var rvs []*RemoteValue
	stop := make(chan struct{})
	scheduled := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				scheduled <- nil
				return
			default:
			}
			mu.Lock()
			var wait *RemoteValue
			if n := len(rvs); n >= 4 {
				wait = rvs[n-4]
			}
			mu.Unlock()
			if wait != nil {
				if err := wait.Wait(ctx); err != nil {
					scheduled <- err
					return
				}
			}
			rv, err := c.Schedule(train, input)
			if err != nil {
				scheduled <- err
				return
			}
			mu.Lock()
			rvs = append(rvs, rv)
			mu.Unlock()
		}
	}()
	succeeded := func() int { return c.Stats().Succeeded }
	t0 := time.Now()
	waitFor(t, time.Minute, "50 steps", func() bool { return succeeded() >= 50 })
	t.Logf("50 steps after %v", time.Since(t0))
	w1 := cluster.Task{Type: cluster.Worker, Index: 1}
	tasks[w1].kill()
	killedAt := succeeded()
	waitFor(t, time.Minute, "30 steps after the kill", func() bool { return succeeded() >= killedAt+30 })
	st := c.Stats()
	assert.False(t, st.Alive[1], "worker 1 is dead")
	assert.GreaterOrEqual(t, st.WorkerFailures, 1)
	byWorker1 := st.PerWorker[1]
	t.Logf("30 more after %v", time.Since(t0))
	tasks[w1].start()
	waitFor(t, time.Minute, "the restarted worker 1 to take 10 steps", func() bool { return c.Stats().PerWorker[1] >= byWorker1+10 })
	t.Logf("rejoined after %v", time.Since(t0))
	close(stop)
	require.NoError(t, <-scheduled)
	require.NoError(t, c.Join(ctx))

	mu.Lock()
	defer mu.Unlock()
	for i, rv := range rvs {
		require.NoError(t, rv.Wait(ctx), "step %d", i)
	}
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, len(rvs), applied, "every scheduled step's update is applied exactly once")
	st = c.Stats()
	assert.Equal(t, len(rvs), st.Succeeded)
	assert.GreaterOrEqual(t, st.Retries, 1, "the step worker 1 was running when it died ran again elsewhere")
	assert.GreaterOrEqual(t, st.Reconnects, 1)
	assert.True(t, st.Alive[1])
	t.Logf("%d steps, stats %+v", len(rvs), st)
	acc := accuracy(t, ctx, c, eval, test)
	assert.Greater(t, acc, 0.8, "training went on through the failure")
}

// A ps task that dies fails the pending steps with an error naming it, fast;
// a relaunched cluster, with another number of ps tasks, resumes from the
// last checkpoint.
func TestPSFailureIsReportedAndARelaunchResumes(t *testing.T) {
	spec, tasks := childCluster(t, 1, 1)
	ctx := testContext(t, 5*time.Minute)
	// What the failure is reported well before: a step that waited for the
	// dead ps task would end at this timeout.
	const stepTimeout = 2 * time.Minute
	s, err := New(ctx, chiefResolver(t, spec), WithStartupTimeout(time.Minute), WithStepTimeout(stepTimeout), WithThreads(1, 2))
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 16); return err }))
	train, _ := buildDigits(t, s, m, optimizer.NewAdam(optimizer.Constant(0.01)))
	c := newCoordinator(t, s)
	trainData, _ := digitsData(t)
	input := perWorkerDigits(t, c, trainData, 32)
	dir := t.TempDir()
	mgr, err := checkpoint.NewManager(s, dir)
	require.NoError(t, err)
	for step := 20; step <= 40; step += 20 {
		for range 20 {
			_, err := c.Schedule(train, input)
			require.NoError(t, err)
		}
		require.NoError(t, c.Join(ctx))
		_, err := mgr.Save(ctx, int64(step), nil)
		require.NoError(t, err)
	}
	saved := map[string]*tf.Tensor{}
	for _, v := range m.Vars() {
		saved[v.Name()], err = s.Value(ctx, v)
		require.NoError(t, err)
	}

	tasks[cluster.Task{Type: cluster.PS, Index: 0}].kill()
	start := time.Now()
	for range 10 {
		if _, err := c.Schedule(train, input); err != nil {
			break
		}
	}
	err = c.Join(ctx)
	var pe *PSFailureError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, cluster.Task{Type: cluster.PS, Index: 0}, pe.Task)
	assert.Contains(t, err.Error(), "restore the last checkpoint")
	assert.Less(t, time.Since(start), stepTimeout/2, "the failure is reported well within the %v step timeout", stepTimeout)
	_, err = c.Schedule(train, input)
	assert.ErrorAs(t, err, &pe, "later steps fail with the same error")
	t.Logf("reported after %v", time.Since(start))
	require.NoError(t, s.Close())
	t.Logf("closed after %v", time.Since(start))

	// The relaunch: a new cluster, two ps tasks this time.
	spec2, _ := childCluster(t, 1, 2)
	s2, err := New(ctx, chiefResolver(t, spec2), WithStartupTimeout(time.Minute), WithThreads(1, 2))
	require.NoError(t, err)
	defer s2.Close()
	var m2 *nn.Sequential
	require.NoError(t, s2.Scope(func(sc strategy.Scope) (err error) { m2, err = newMLP(sc, 16); return err }))
	buildDigits(t, s2, m2, optimizer.NewAdam(optimizer.Constant(0.01)))
	mgr2, err := checkpoint.NewManager(s2, dir)
	require.NoError(t, err)
	t.Logf("relaunched after %v", time.Since(start))
	step, _, err := mgr2.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 40, step)
	applied, err := s2.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 40, applied)
	for _, v := range m2.Vars() {
		got, err := s2.Value(ctx, v)
		require.NoError(t, err)
		assert.Equal(t, saved[v.Name()].Value(), got.Value(), v.Name())
	}
}
