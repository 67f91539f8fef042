package multiworker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

func loopbackSpec(t testing.TB, workers int) cluster.ClusterSpec {
	return testcluster.LoopbackSpec(t, workers)
}

// onWorkers starts a multiworker strategy for each worker of spec, in one
// process, runs fn on each at once, closes them, and returns each worker's
// error.
func onWorkers(spec cluster.ClusterSpec, opts []multiworker.Option, fn func(w int, s *multiworker.Strategy) error) []error {
	return testcluster.OnWorkers(spec, opts, fn)
}

// onTwoWorkers is onWorkers on two loopback workers on comm, whose
// collectives time out after timeout, with opts besides.
func onTwoWorkers(t *testing.T, comm multiworker.Communication, timeout time.Duration,
	fn func(w int, s *multiworker.Strategy) error, opts ...multiworker.Option) []error {
	return onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithCommunication(comm),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(timeout)}, opts...), fn)
}

// Two workers in one process (each with its own TensorFlow server) train
// together; both end with the default strategy's model.
func TestInProcessWorkersMatchDefault(t *testing.T) {
	matchDefault(t, "mlp", 30)
}

// The LeNet CNN of every strategy's tests, on 2 workers of 2 devices, ends
// 200 SGD steps with the default strategy's model.
func TestCNNMatchesDefault(t *testing.T) {
	matchDefault(t, "lenet", 200)
}

// An MLP with 16,384 hidden units, whose first layer's gradient (4 MiB)
// the workers write into each other's results over shared memory, on 2
// workers of 2 devices, ends 20 SGD steps with the default strategy's
// model, and the workers hold identical variables.
func TestPushedGradientsMatchDefault(t *testing.T) {
	matchDefaultPlan(t, testmodel.Plan{Model: "mlp", Hidden: 16384, Steps: 20})
}

func matchDefault(t *testing.T, model string, steps int) {
	matchDefaultPlan(t, testmodel.Plan{Model: model, Steps: steps})
}

// matchDefaultPlan trains p (on global batches of 32) with the default
// strategy and on 2 workers of 2 devices, and checks that they agree (see
// matchOnTwoWorkers).
func matchDefaultPlan(t *testing.T, p testmodel.Plan) {
	p.MicroBatches = []int{32}
	want, err := testmodel.TrainDefault(context.Background(), optimizer.NewSGD(optimizer.Constant(0.1)), p)
	require.NoError(t, err)
	matchOnTwoWorkers(t, p, want, 2)
}

// matchOnTwoWorkers trains p on 2 workers of local devices each, with
// opts, and checks that it ends with want: the final loss within 1e-4 of
// want's, every element of every variable within 1e-4 of its variable's
// largest magnitude (testmodel.MaxVarDiff; measured: at most 8.3e-7 on
// the three models), and both workers' variables bit for bit. It returns
// worker 0's outcome and the bytes it sent on tfdist's engine.
func matchOnTwoWorkers(t *testing.T, p testmodel.Plan, want testmodel.Outcome, local int, opts ...multiworker.Option) (testmodel.Outcome, int64) {
	t.Helper()
	got := make([]testmodel.Outcome, 2)
	var sent int64
	errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithLogicalCPUs(local),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, opts...),
		func(w int, s *multiworker.Strategy) error {
			assert.Equal(t, 2*local, s.NumReplicasInSync())
			assert.Equal(t, w == 0, s.IsChief())
			var err error
			wp := p
			wp.FirstReplica = w * local
			got[w], err = testmodel.TrainPlan(context.Background(), s, optimizer.NewSGD(optimizer.Constant(0.1)), wp)
			if w == 0 {
				sent = s.CollectiveStats().BytesSent
			}
			return err
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for w := range 2 {
		assert.Less(t, testmodel.RelDiff(want.FinalLoss, got[w].FinalLoss), 1e-4, "worker %d loss %v vs %v", w, got[w].FinalLoss, want.FinalLoss)
		d, at := testmodel.MaxVarDiff(want, got[w])
		assert.Less(t, d, 1e-4, "worker %d: largest difference at %s", w, at)
	}
	assert.Equal(t, got[0].Vars, got[1].Vars, "both workers hold identical variables")
	return got[0], sent
}

// A peer that never comes up is a clear error within the start-up timeout.
func TestPeerThatNeverComesUp(t *testing.T) {
	spec := loopbackSpec(t, 2)
	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Worker, Index: 0})
	require.NoError(t, err)
	const startup = 3 * time.Second
	start := time.Now()
	_, err = multiworker.New(context.Background(), multiworker.WithResolver(r), multiworker.WithStartupTimeout(startup))
	require.Error(t, err)
	// Without its startup timeout New would wait for the peer forever.
	assert.Less(t, time.Since(start), startup+30*time.Second, "New ends at its %v startup timeout", startup)
	assert.Contains(t, err.Error(), "worker:1")
	addr, _ := spec.TaskAddress(cluster.Worker, 1)
	assert.Contains(t, err.Error(), addr)
}

// Workers given different clusters find out at start-up, and the error says
// which task disagrees.
func TestWorkersThatDisagreeOnTheCluster(t *testing.T) {
	spec := loopbackSpec(t, 2)
	jobs := spec.AsMap()
	other := map[cluster.TaskType][]string{cluster.Worker: {jobs[cluster.Worker][0], jobs[cluster.Worker][1]}, cluster.Evaluator: {"127.0.0.1:1"}}
	spec2, err := cluster.NewClusterSpec(other)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for w, sp := range []cluster.ClusterSpec{spec, spec2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := cluster.NewSimpleResolver(sp, cluster.Task{Type: cluster.Worker, Index: w})
			if err != nil {
				errs[w] = err
				return
			}
			s, err := multiworker.New(context.Background(), multiworker.WithResolver(r), multiworker.WithStartupTimeout(20*time.Second))
			if err == nil {
				s.Close()
			}
			errs[w] = err
		}()
	}
	wg.Wait()
	require.Error(t, errs[0])
	assert.Contains(t, errs[0].Error(), "worker:1", "worker 0 names the task that disagrees")
}

func TestTaskTypesMultiWorkerDoesNotRun(t *testing.T) {
	ports, err := freeport.Loopback(3)
	require.NoError(t, err)
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Worker: {fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])},
		cluster.PS:     {fmt.Sprintf("127.0.0.1:%d", ports[2])}})
	require.NoError(t, err)
	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.PS, Index: 0})
	require.NoError(t, err)
	_, err = multiworker.New(context.Background(), multiworker.WithResolver(r))
	assert.ErrorContains(t, err, "ps:0")
}

// Writes with OnlyFirstReplica and Sum aggregation combine every worker's
// replicas: all copies take global replica 0's value, or the global sum.
func TestAggregatedWritesSpanWorkers(t *testing.T) {
	ctx := context.Background()
	got := make([][2]float32, 2)
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			var err error
			var first, sum strategy.Variable
			if err := s.Scope(func(sc strategy.Scope) error {
				if first, err = sc.Variable("first", tf.Float, nil, strategy.Zeros(), strategy.WithAggregation(strategy.AggregationOnlyFirstReplica)); err != nil {
					return err
				}
				sum, err = sc.Variable("sum", tf.Float, nil, strategy.Zeros(), strategy.WithAggregation(strategy.AggregationSum))
				return err
			}); err != nil {
				return err
			}
			spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}
			step, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				val := op.Const(rc.Scope().SubScope("v"), float32(rc.ReplicaID()+1)) // 1, 2 on worker 0; 3, 4 on worker 1
				if err := rc.Assign(first, val); err != nil {
					return nil, err
				}
				return strategy.Outputs{"x": op.Identity(rc.Scope().SubScope("x"), in["x"])}, rc.Assign(sum, val)
			})
			if err != nil {
				return err
			}
			x, _ := tf.NewTensor([]float32{1})
			if _, err := s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"x": x}, {"x": x}}, 4); err != nil {
				return err
			}
			for i, v := range []strategy.Variable{first, sum} {
				copies, err := s.Copies(ctx, v)
				if err != nil {
					return err
				}
				if a, b := copies[0].Value().(float32), copies[1].Value().(float32); a != b {
					return fmt.Errorf("%s: copies differ: %v, %v", v.Name(), a, b)
				}
				got[w][i] = copies[0].Value().(float32)
			}
			return nil
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for w := range 2 {
		assert.Equal(t, float32(1), got[w][0], "worker %d: OnlyFirstReplica takes global replica 0's value", w)
		assert.Equal(t, float32(10), got[w][1], "worker %d: Sum adds all four replicas", w)
	}
}

// A step whose peer never joins fails within the collective timeout, the
// error says the strategy cannot go on, and every later run says so at once
// instead of waiting again.
func TestStepPastItsDeadlineEndsTheStrategy(t *testing.T) {
	ctx := context.Background()
	const timeout = 3 * time.Second
	peerDone := make(chan struct{})
	var late, after error
	var took time.Duration
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithStartupTimeout(30 * time.Second),
		multiworker.WithCollectiveTimeout(timeout)},
		func(w int, s *multiworker.Strategy) error {
			var v strategy.Variable
			if err := s.Scope(func(sc strategy.Scope) error {
				var err error
				v, err = sc.Variable("v", tf.Float, nil, strategy.Zeros())
				return err
			}); err != nil {
				return err
			}
			step, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}},
				func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
					sum, err := rc.AllReduce(strategy.Sum, op.Sum(rc.Scope().SubScope("sum"), in["x"], op.Const(rc.Scope().SubScope("axis"), int32(0))))
					return strategy.Outputs{"sum": sum}, err
				})
			if err != nil {
				return err
			}
			x, _ := tf.NewTensor([]float32{1, 2})
			run := func() error {
				_, err := s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"x": x}}, 2)
				return err
			}
			if err := run(); err != nil {
				return err
			}
			if w == 1 {
				<-peerDone // alive, but it takes no further step
				return nil
			}
			defer close(peerDone)
			start := time.Now()
			late = run()
			took = time.Since(start)
			_, after = s.Value(ctx, v)
			return nil
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Error(t, late, "a step that worker 1 never joins")
	assert.ErrorIs(t, late, strategy.ErrCannotContinue)
	assert.Contains(t, late.Error(), "cannot go on")
	// Worker 1 never joins: without the collective timeout the step would
	// wait forever, so any bound far past the timeout tells them apart.
	assert.Less(t, took, timeout+30*time.Second, "failed after %v; the collective timeout is %v", took, timeout)
	assert.GreaterOrEqual(t, took, timeout-time.Second, "failed after %v, before the collective timeout %v", took, timeout)
	require.Error(t, after, "the strategy runs nothing after a failed step")
	assert.ErrorIs(t, after, strategy.ErrCannotContinue)
}

func TestNegativeCollectiveTimeoutIsAnError(t *testing.T) {
	r, err := cluster.NewSimpleResolver(loopbackSpec(t, 2), cluster.Task{Type: cluster.Worker, Index: 0})
	require.NoError(t, err)
	_, err = multiworker.New(context.Background(), multiworker.WithResolver(r), multiworker.WithCollectiveTimeout(-time.Second))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithCollectiveTimeout(-1s)")
	assert.Contains(t, err.Error(), "0 to wait forever")
}
