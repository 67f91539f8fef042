package paramserver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// serveEnv makes the test binary a ps or worker task: the process tests
// start their cluster's tasks as children of the test process, running
// Serve from TF_CONFIG, so that a test can kill one.
const serveEnv = "PARAMSERVER_TEST_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := Serve(ctx, nil, WithThreads(1, 2)); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func testContext(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newInProcess starts a cluster of workers and ps tasks in this process and
// returns the chief's strategy.
func newInProcess(t *testing.T, workers, ps int, opts ...Option) *Strategy {
	t.Helper()
	cl, err := StartInProcessCluster(workers, ps, WithThreads(1, 2))
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	s, err := New(testContext(t, time.Minute), cl.Resolver(), append([]Option{WithStepTimeout(30 * time.Second), WithThreads(1, 2)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func newCoordinator(t *testing.T, s *Strategy, opts ...CoordinatorOption) *Coordinator {
	t.Helper()
	c, err := NewCoordinator(s, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.Done(ctx)
	})
	return c
}

func tensor(t testing.TB, v any) *tf.Tensor {
	t.Helper()
	x, err := tf.NewTensor(v)
	require.NoError(t, err)
	return x
}

// newMLP is the digits classifier of every strategy's tests: 64 inputs, a
// ReLU hidden layer, 10 logits.
func newMLP(sc strategy.Scope, hidden int) (*nn.Sequential, error) {
	return models.New(sc, "mlp", hidden, 1)
}

// buildDigits builds the training and evaluation functions of m.
func buildDigits(t testing.TB, s *Strategy, m *nn.Sequential, opt strategy.Optimizer) (train, eval *Function) {
	t.Helper()
	train, err := s.Build(models.Spec, models.TrainStep(m, opt))
	require.NoError(t, err)
	eval, err = s.Build(models.Spec, models.EvalStep(m, nil))
	require.NoError(t, err)
	return train, eval
}

// digitsData returns the training and held-out digits.
func digitsData(t testing.TB) (train, test digits.Data) {
	t.Helper()
	d, err := digits.Load()
	require.NoError(t, err)
	return d.Split(297, 1)
}

// perWorkerDigits gives each worker its shard of the training data,
// shuffled, repeated and batched.
func perWorkerDigits(t testing.TB, c *Coordinator, train digits.Data, batch int) *PerWorkerDataset {
	t.Helper()
	d, err := c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		ds, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
		if err != nil {
			return nil, err
		}
		ds = dataset.Shard(ds, ictx.NumInputPipelines, ictx.InputPipelineID)
		return dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, train.Len(), uint64(1+ictx.InputPipelineID)), -1), batch, true), nil
	})
	require.NoError(t, err)
	return d
}

// accuracy scores the held-out data with eval, scheduled on the workers.
func accuracy(t *testing.T, ctx context.Context, c *Coordinator, eval *Function, test digits.Data) float64 {
	t.Helper()
	var rvs []*RemoteValue
	for lo := 0; lo < test.Len(); lo += 100 {
		hi := min(lo+100, test.Len())
		rv, err := c.Schedule(eval, Feed(dataset.Element{"x": tensor(t, test.X[lo:hi]), "y": tensor(t, test.Y[lo:hi])}))
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	var correct float32
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		require.NoError(t, err)
		correct += out["correct"].Value().(float32)
	}
	return float64(correct) / float64(test.Len())
}

// task is a ps or worker task running as a child process.
type task struct {
	t    testing.TB
	task cluster.Task
	tfc  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

// childCluster returns a cluster spec on free ports with a chief (this
// process), workers and ps tasks, and starts the ps and worker tasks as
// children that serve.
func childCluster(t testing.TB, workers, ps int) (cluster.ClusterSpec, map[cluster.Task]*task) {
	t.Helper()
	ports, err := freeport.Loopback(1 + workers + ps)
	require.NoError(t, err)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	jobs := map[cluster.TaskType][]string{cluster.Chief: {addr(0)}}
	for i := range workers {
		jobs[cluster.Worker] = append(jobs[cluster.Worker], addr(1+i))
	}
	for i := range ps {
		jobs[cluster.PS] = append(jobs[cluster.PS], addr(1+workers+i))
	}
	spec, err := cluster.NewClusterSpec(jobs)
	require.NoError(t, err)
	tasks := map[cluster.Task]*task{}
	for _, tk := range spec.Tasks() {
		if tk.Type == cluster.Chief {
			continue
		}
		tfc, err := cluster.Marshal(spec, tk)
		require.NoError(t, err)
		c := &task{t: t, task: tk, tfc: tfc}
		c.start()
		tasks[tk] = c
	}
	t.Cleanup(func() {
		for _, c := range tasks {
			c.kill()
		}
	})
	return spec, tasks
}

func (c *task) start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"=1", "TF_CONFIG="+c.tfc, "TF_CPP_MIN_LOG_LEVEL=2")
	cmd.Stdout, cmd.Stderr = &c.out, &c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(c.t, cmd.Start())
	c.cmd, c.done = cmd, make(chan struct{})
	done := c.done
	go func() { cmd.Wait(); close(done) }()
}

// kill kills the task with SIGKILL and waits for it to exit.
func (c *task) kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.t.Errorf("task %s did not exit after SIGKILL", c.task)
	}
}

func chiefResolver(t testing.TB, spec cluster.ClusterSpec) cluster.Resolver {
	t.Helper()
	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Chief})
	require.NoError(t, err)
	return r
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// psVar returns v as the strategy's own variable, to inspect its shards.
func psVar(v strategy.Variable) *Variable { return v.(*Variable) }
