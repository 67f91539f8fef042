package tfrt_test

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	pb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/tfrt"
)

func run(t *testing.T, s *op.Scope, so *tf.SessionOptions, fetches ...tf.Output) []*tf.Tensor {
	t.Helper()
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, so)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, fetches, nil)
	require.NoError(t, err)
	return out
}

func TestVersionIs218(t *testing.T) {
	assert.Regexp(t, `^2\.18\.`, tfrt.Version())
}

func TestMatMul(t *testing.T) {
	s := op.NewScope()
	a := op.Const(s.SubScope("a"), [][]float32{{1, 2, 3}, {4, 5, 6}})
	b := op.Const(s.SubScope("b"), [][]float32{{7, 8}, {9, 10}, {11, 12}})
	out := run(t, s, nil, op.MatMul(s, a, b))
	assert.Equal(t, [][]float32{{58, 64}, {139, 154}}, out[0].Value())
}

// f(x) = sum(tanh(W x) * c) has an analytic gradient from TensorFlow's C++
// gradient registry; it must agree with central finite differences.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	w := [][]float64{{0.3, -0.2, 0.5}, {0.1, 0.4, -0.6}}
	c := []float64{1.5, -0.7}
	f := func(x []float64) float64 {
		sum := 0.0
		for i := range w {
			z := 0.0
			for j := range x {
				z += w[i][j] * x[j]
			}
			sum += math.Tanh(z) * c[i]
		}
		return sum
	}
	x0 := []float64{0.2, -0.1, 0.7}

	s := op.NewScope()
	x := op.Placeholder(s, tf.Double, op.PlaceholderShape(tf.MakeShape(3, 1)))
	y := op.Sum(s, op.Mul(s, op.Tanh(s, op.MatMul(s, op.Const(s.SubScope("w"), w), x)),
		op.Const(s.SubScope("c"), [][]float64{{c[0]}, {c[1]}})), op.Const(s.SubScope("axes"), []int32{0, 1}))
	grads := op.Gradients(s, []tf.Output{y}, []tf.Output{x})
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	xt, err := tf.NewTensor([][]float64{{x0[0]}, {x0[1]}, {x0[2]}})
	require.NoError(t, err)
	out, err := sess.Run(map[tf.Output]*tf.Tensor{x: xt}, grads, nil)
	require.NoError(t, err)
	got := out[0].Value().([][]float64)

	const h = 1e-6
	for j := range x0 {
		xp, xm := append([]float64(nil), x0...), append([]float64(nil), x0...)
		xp[j] += h
		xm[j] -= h
		fd := (f(xp) - f(xm)) / (2 * h)
		assert.InDelta(t, fd, got[j][0], 1e-7, "d/dx[%d]", j)
	}
}

func TestLogicalCPUDevices(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			devs, err := tfrt.LocalDevices(tfrt.WithLogicalCPUs(n))
			require.NoError(t, err)
			cpus := 0
			for _, d := range devs {
				if d.Type == "CPU" {
					cpus++
				}
			}
			require.Equal(t, n, cpus, "devices: %v", devs)

			// An op pinned to the last device runs there.
			s := op.NewScope()
			last := fmt.Sprintf("/device:CPU:%d", n-1)
			v := op.Add(s.WithDevice(last), op.Const(s.SubScope("a"), int32(40)), op.Const(s.SubScope("b"), int32(2)))
			assert.Contains(t, v.Op.Device(), fmt.Sprintf("CPU:%d", n-1))
			so, err := tfrt.SessionOptions("", tfrt.WithLogicalCPUs(n))
			require.NoError(t, err)
			assert.Equal(t, int32(42), run(t, s, so, v)[0].Value())
		})
	}
}

func TestUnknownDeviceIsAnError(t *testing.T) {
	s := op.NewScope()
	v := op.Add(s.WithDevice("/device:CPU:5"), op.Const(s.SubScope("a"), int32(1)), op.Const(s.SubScope("b"), int32(2)))
	g, err := s.Finalize()
	require.NoError(t, err)
	so, err := tfrt.SessionOptions("", tfrt.WithLogicalCPUs(2))
	require.NoError(t, err)
	sess, err := tf.NewSession(g, so)
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Run(nil, []tf.Output{v}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CPU:5")
}

func clusterDef(addrs ...string) *pb.ClusterDef {
	tasks := map[int32]string{}
	for i, a := range addrs {
		tasks[int32(i)] = a
	}
	return &pb.ClusterDef{Job: []*pb.JobDef{{Name: "worker", Tasks: tasks}}}
}

func TestTwoTaskCluster(t *testing.T) {
	ports, err := freeport.Loopback(2)
	require.NoError(t, err)
	cd := clusterDef(fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]))
	var servers []*tfrt.Server
	for i := range 2 {
		srv, err := tfrt.NewServer(&pb.ServerDef{Cluster: cd, JobName: "worker", TaskIndex: int32(i), Protocol: "grpc"})
		require.NoError(t, err)
		require.NoError(t, srv.Start())
		require.NoError(t, srv.Start(), "starting twice is a no-op")
		t.Cleanup(func() { srv.Close() })
		servers = append(servers, srv)
	}
	assert.Contains(t, servers[0].Target(), fmt.Sprint(ports[0]))

	s := op.NewScope()
	remote := s.WithDevice("/job:worker/replica:0/task:1/device:CPU:0")
	a := op.Placeholder(remote, tf.Int64)
	v := op.Mul(remote, a, op.Const(remote, int64(7)))
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, &tf.SessionOptions{Target: servers[0].Target()})
	require.NoError(t, err)
	defer sess.Close()
	six, err := tf.NewTensor(int64(6))
	require.NoError(t, err)
	out, err := sess.Run(map[tf.Output]*tf.Tensor{a: six}, []tf.Output{v}, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(42), out[0].Value())

	devs, err := tfrt.ListDevices(sess)
	require.NoError(t, err)
	names := fmt.Sprint(devs)
	assert.Contains(t, names, "/job:worker/replica:0/task:0/device:CPU:0")
	assert.Contains(t, names, "/job:worker/replica:0/task:1/device:CPU:0")

	for _, srv := range servers {
		assert.NoError(t, srv.Stop())
		assert.NoError(t, srv.Stop(), "stopping twice is safe")
		assert.NoError(t, srv.Close())
		assert.NoError(t, srv.Close(), "closing twice is safe")
		assert.Error(t, srv.Start(), "a stopped server does not start again")
	}
}

func TestStopNeverStartedServer(t *testing.T) {
	ports, err := freeport.Loopback(1)
	require.NoError(t, err)
	srv, err := tfrt.NewServer(&pb.ServerDef{Cluster: clusterDef(fmt.Sprintf("127.0.0.1:%d", ports[0])), JobName: "worker"})
	require.NoError(t, err)
	assert.NoError(t, srv.Stop())
	assert.NoError(t, srv.Stop())
	assert.NoError(t, srv.Close())
	assert.ErrorIs(t, srv.Join(), tfrt.ErrFailedPrecondition)
}

func TestPortInUseNamesThePort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = tfrt.NewServer(&pb.ServerDef{Cluster: clusterDef(fmt.Sprintf("127.0.0.1:%d", port)), JobName: "worker"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprint(port))
	assert.Contains(t, err.Error(), "in use")
	assert.ErrorIs(t, err, tfrt.ErrUnavailable)
}

func TestMalformedServerDef(t *testing.T) {
	cases := map[string]struct {
		def  *pb.ServerDef
		want string
	}{
		"nil":           {nil, "nil ServerDef"},
		"no jobs":       {&pb.ServerDef{JobName: "worker"}, "cluster"},
		"unknown job":   {&pb.ServerDef{Cluster: clusterDef("127.0.0.1:1"), JobName: "ps"}, `job_name: "ps"`},
		"no such task":  {&pb.ServerDef{Cluster: clusterDef("127.0.0.1:1"), JobName: "worker", TaskIndex: 3}, "task_index: 3"},
		"bad address":   {&pb.ServerDef{Cluster: clusterDef("localhost"), JobName: "worker"}, `"localhost"`},
		"bad port":      {&pb.ServerDef{Cluster: clusterDef("127.0.0.1:99999"), JobName: "worker"}, "99999"},
		"bad protocol":  {&pb.ServerDef{Cluster: clusterDef("127.0.0.1:1"), JobName: "worker", Protocol: "http"}, "protocol"},
		"empty jobname": {&pb.ServerDef{Cluster: &pb.ClusterDef{Job: []*pb.JobDef{{Tasks: map[int32]string{0: "127.0.0.1:1"}}}}}, "empty name"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := tfrt.NewServer(c.def)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.ErrorIs(t, err, tfrt.ErrInvalidArgument)
		})
	}
}

func TestClassify(t *testing.T) {
	err := tfrt.Classify("run step", errors.New("failed to connect to all addresses; last error: UNKNOWN"))
	assert.ErrorIs(t, err, tfrt.ErrUnavailable)
	var te *tfrt.Error
	require.ErrorAs(t, err, &te)
	assert.Equal(t, "run step", te.Op)
	assert.Nil(t, tfrt.Classify("x", nil))
	assert.ErrorIs(t, tfrt.Classify("x", errors.New("boom")), tfrt.ErrUnknown)

	// The code a status starts with is the run's own, whatever errors of
	// other tasks it quotes (a step's other partitions, cancelled).
	mixed := errors.New("INVALID_ARGUMENT: \n=====\nINVALID_ARGUMENT: From /job:ps/replica:0/task:0:\nassertion failed\n" +
		"CANCELLED: From /job:worker/replica:0/task:1:\nRunGraph was cancelled\n=====")
	assert.ErrorIs(t, tfrt.Classify("run step", mixed), tfrt.ErrInvalidArgument)
	assert.ErrorIs(t, tfrt.Classify("run step", errors.New("UNKNOWN: Socket closed")), tfrt.ErrUnavailable)

	// A message that quotes a whole request (a tensor's 40 KB) shows only
	// its start, and says how much it leaves out; Msg keeps all of it.
	long := "ABORTED: The same RunGraph (Worker) request was received twice. send { tensor_content: \"" +
		strings.Repeat("\\000\\200?", 4000) + "\" } } naming /job:worker/replica:0/task:1"
	err = tfrt.Classify("run step", errors.New(long))
	require.ErrorAs(t, err, &te)
	assert.Equal(t, long, te.Msg)
	assert.Less(t, len(err.Error()), 2200)
	assert.Contains(t, err.Error(), "run step: ABORTED: ABORTED: The same RunGraph (Worker) request was received twice.")
	assert.Contains(t, err.Error(), fmt.Sprintf("[%d more bytes of TensorFlow's message]", len(long)-2048))
}

func TestParseDevice(t *testing.T) {
	d, err := tfrt.ParseDevice("/job:worker/replica:0/task:1/device:GPU:2")
	require.NoError(t, err)
	assert.Equal(t, tfrt.DeviceSpec{Job: "worker", Replica: 0, Task: 1, Type: "GPU", Index: 2}, d)
	assert.Equal(t, "/job:worker/replica:0/task:1/device:GPU:2", d.String())
	d, err = tfrt.ParseDevice("/cpu:1")
	require.NoError(t, err)
	assert.True(t, d.Matches("/job:localhost/replica:0/task:0/device:CPU:1"))
	assert.False(t, d.Matches("/job:localhost/replica:0/task:0/device:CPU:0"))
	for _, bad := range []string{"", "/device:CPU", "/job", "/task:x", "/foo:1"} {
		_, err := tfrt.ParseDevice(bad)
		assert.Error(t, err, bad)
	}
}

// A run that TensorFlow fails keeps its status code through
// ClassifyStatus, whatever its message says: graft's errors carry
// TensorFlow's message only, and the code is read from their TF_Status.
func TestGraftStatusCodes(t *testing.T) {
	s := op.NewScope()
	fed := op.Placeholder(s.SubScope("fed"), tf.Float)
	v := op.VarHandleOp(s.SubScope("v"), tf.Float, tf.ScalarShape())
	read := op.ReadVariableOp(s.SubScope("read"), v, tf.Float)
	q := op.FIFOQueueV2(s.SubScope("queue"), []tf.DataType{tf.Float})
	closeQ := op.QueueCloseV2(s.SubScope("close"), q)
	dequeue := op.QueueDequeueV2(s.SubScope("dequeue"), q, []tf.DataType{tf.Float})
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Run(nil, nil, []*tf.Operation{closeQ})
	require.NoError(t, err)
	for _, c := range []struct {
		fetch tf.Output
		want  error
	}{
		{fed, tfrt.ErrInvalidArgument},     // a placeholder not fed
		{read, tfrt.ErrFailedPrecondition}, // a variable never assigned
		{dequeue[0], tfrt.ErrOutOfRange},   // a closed, empty queue
	} {
		_, err := sess.Run(nil, []tf.Output{c.fetch}, nil)
		require.Error(t, err)
		got := tfrt.ClassifyStatus("run", err)
		assert.ErrorIs(t, got, c.want, "%v", got)
	}
}
