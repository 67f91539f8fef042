package paramserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// A recorder in front of the ps task sees, in plaintext, the weights the
// worker reads and the gradients it sends; under mutual TLS, with each
// task's own certificate, it sees neither, while the steps run and apply
// as before.
func TestTLSHidesTheTensorsFromTheWire(t *testing.T) {
	plain := wireOfSteps(t, false)
	assert.True(t, bytes.Contains(plain, weightPattern()), "the test sees the weights on a plaintext wire")
	assert.True(t, bytes.Contains(plain, gradientPattern()), "the test sees the gradients on a plaintext wire")
	secret := wireOfSteps(t, true)
	assert.NotEmpty(t, secret)
	assert.False(t, bytes.Contains(secret, weightPattern()), "weights on the wire under TLS")
	assert.False(t, bytes.Contains(secret, gradientPattern()), "gradients on the wire under TLS")
}

const (
	wireWeight = float32(1234.5678)
	wireInput  = float32(0.125)
	wireRows   = 64
)

// weightPattern is four of the variable's elements as they travel.
func weightPattern() []byte { return floats(wireWeight, 4) }

// gradientPattern is four elements of the gradient of sum(w * x) over w:
// each is the input's value.
func gradientPattern() []byte { return floats(wireInput, 4) }

func floats(v float32, n int) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// wireOfSteps runs 5 steps of a chief, a worker and a ps task whose
// traffic to the ps task passes a recorder, and returns what the recorder
// saw.
func wireOfSteps(t *testing.T, useTLS bool) []byte {
	ports, err := freeport.Loopback(4)
	require.NoError(t, err)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {addr(0)}, cluster.Worker: {addr(1)}, cluster.PS: {addr(2)}})
	require.NoError(t, err)
	tlsCfg := func(cluster.Task) Option { return WithTLS(nil) }
	if useTLS {
		files, _, remove, err := mtls.WriteTempTasks("wire", "wire-test", spec.Tasks(), time.Hour)
		require.NoError(t, err)
		t.Cleanup(remove)
		tlsCfg = func(task cluster.Task) Option {
			cfg, err := mtls.LoadConfig(files[task])
			require.NoError(t, err)
			return WithTLS(cfg)
		}
	}
	psTask, workerTask := cluster.Task{Type: cluster.PS}, cluster.Task{Type: cluster.Worker}

	// The ps task serves on the fourth port; its address in the cluster is
	// the recorder's.
	c := newConfig([]Option{tlsCfg(psTask)})
	host, err := partition.NewHost(nil)
	require.NoError(t, err)
	srv := taskserver.NewServer(host, taskOptions(spec, c.tls, zap.NewNop())...)
	ln, err := net.Listen("tcp", addr(3))
	require.NoError(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); host.Close() })
	rec := startRecorder(t, addr(2), addr(3))

	wc := newConfig([]Option{tlsCfg(workerTask), WithThreads(1, 2)})
	worker, err := startTask(spec, workerTask, wc, wc.tls, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(func() { worker.stop() })

	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Chief})
	require.NoError(t, err)
	ctx := testContext(t, time.Minute)
	s, err := New(ctx, r, tlsCfg(cluster.Task{Type: cluster.Chief}), WithThreads(1, 2))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var w strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		w, err = sc.Variable("w", tf.Float, []int64{wireRows}, strategy.Constant(tensor(t, floats32(wireWeight, wireRows))))
		return err
	}))
	step, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{wireRows}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sc := rc.Scope()
			wv, err := rc.Read(w)
			if err != nil {
				return nil, err
			}
			loss := op.Sum(sc.SubScope("loss"), op.Mul(sc.SubScope("wx"), wv, in["x"]), op.Const(sc.SubScope("axis"), int32(0)))
			return strategy.Outputs{"loss": loss}, rc.Minimize(optimizer.NewSGD(optimizer.Constant(1e-6)), loss, []strategy.Variable{w})
		})
	require.NoError(t, err)
	coord := newCoordinator(t, s)
	in := Feed(dataset.Element{"x": tensor(t, floats32(wireInput, wireRows))})
	for range 5 {
		rv, err := coord.Schedule(step, in)
		require.NoError(t, err)
		require.NoError(t, rv.Wait(ctx))
		require.True(t, rv.Info().Applied)
	}
	return []byte(rec.String())
}

func floats32(v float32, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// startRecorder forwards the connections it accepts at listen to to, and
// keeps every byte that passes, both ways.
func startRecorder(t *testing.T, listen, to string) *syncbuf.Buffer {
	ln, err := net.Listen("tcp", listen)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	r := &syncbuf.Buffer{}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			go pipe(out, in, r)
			go pipe(in, out, r)
		}
	}()
	return r
}

func pipe(dst, src net.Conn, rec io.Writer) {
	defer dst.Close()
	defer src.Close()
	io.Copy(io.MultiWriter(dst, rec), src)
}

// A step on parameter servers reads on every ps task, computes once on
// the worker, then updates on the ps tasks: with one ps task that is three
// rounds; with two, the update waits for the guard's check on ps 0, and
// ps 0 records the step after ps 1's update.
func TestStepRounds(t *testing.T) {
	const (
		ps0 = "/job:ps/replica:0/task:0"
		ps1 = "/job:ps/replica:0/task:1"
	)
	worker := taskName(cluster.Task{Type: cluster.Worker})
	assert.Equal(t, [][]string{{ps0}, {worker}, {ps0}}, stepRounds(t, 1))
	assert.Equal(t, [][]string{{ps0, ps1}, {worker}, {ps0}, {ps1}, {ps0}}, stepRounds(t, 2))
}

// stepRounds runs a step of Adam on a cluster of one worker and ps ps
// tasks and returns the tasks of each round of its plan.
func stepRounds(t *testing.T, ps int) [][]string {
	s := newInProcess(t, 1, ps)
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 32); return err }))
	train, _ := buildDigits(t, s, m, optimizer.NewAdam(optimizer.Constant(0.01)))
	c := newCoordinator(t, s)
	trainData, _ := digitsData(t)
	rv, err := c.Schedule(train, perWorkerDigits(t, c, trainData, 32))
	require.NoError(t, err)
	require.NoError(t, rv.Wait(testContext(t, time.Minute)))
	require.True(t, rv.Info().Applied)
	plans := s.workers[0].sess.plans
	require.Len(t, plans, 1)
	var rounds [][]string
	for _, p := range plans {
		for _, round := range p.plan.Rounds {
			var tasks []string
			for _, r := range round {
				tasks = append(tasks, r.Task)
			}
			rounds = append(rounds, tasks)
		}
	}
	return rounds
}
