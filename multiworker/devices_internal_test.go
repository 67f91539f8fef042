package multiworker

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

// gpuMachine is the device list TensorFlow reports for a worker that
// sees one CPU and gpus GPUs.
func gpuMachine(gpus int) []tfrt.Device {
	out := []tfrt.Device{{Name: strategy.LocalCPU(0), Type: "CPU"}}
	for i := range gpus {
		out = append(out, tfrt.Device{Name: localGPU(i), Type: "GPU"})
	}
	return out
}

func localGPU(i int) string { return fmt.Sprintf("/job:localhost/replica:0/task:0/device:GPU:%d", i) }

// On a worker with GPUs the replicas go on every GPU, and the local level
// of the all-reduce is NCCL's; logical CPUs, asked for, take the GPUs'
// place; NCCL asked for on CPUs, and a GPU the worker lacks, are refused
// naming the worker, the device and what exists.
func TestDeviceChoiceOnGPUWorkers(t *testing.T) {
	task := cluster.Task{Type: cluster.Worker, Index: 1}
	devices, err := config{}.chooseDevices(gpuMachine(8), task)
	require.NoError(t, err)
	require.Len(t, devices, 8)
	assert.Equal(t, localGPU(7), devices[7])
	assert.True(t, ncclLocal(devices, tf.Float))
	assert.True(t, ncclLocal(devices, tf.Half))
	assert.False(t, ncclLocal(devices, tf.Bfloat16), "NCCL's TensorFlow kernels take no bfloat16: the host sums it")
	assert.Equal(t, []string{"/job:worker/replica:0/task:1/device:GPU:0"}, onTask(devices[:1], task))

	one, err := config{comm: NCCL}.chooseDevices(gpuMachine(1), task)
	require.NoError(t, err)
	assert.Equal(t, []string{localGPU(0)}, one)
	assert.False(t, ncclLocal(one, tf.Float), "one GPU: nothing to reduce locally")

	cpus := []tfrt.Device{{Name: strategy.LocalCPU(0), Type: "CPU"}, {Name: strategy.LocalCPU(1), Type: "CPU"}}
	cpus = append(cpus, gpuMachine(2)[1:]...)
	devices, err = config{logicalCPUs: 2}.chooseDevices(cpus, task)
	require.NoError(t, err)
	assert.Equal(t, []string{strategy.LocalCPU(0), strategy.LocalCPU(1)}, devices)
	assert.False(t, ncclLocal(devices, tf.Float))

	_, err = config{logicalCPUs: 2, comm: NCCL}.chooseDevices(cpus, task)
	assert.ErrorContains(t, err, "task worker:1: WithCommunication(NCCL): NCCL needs every device to be a GPU")
	_, err = config{devices: []string{"/gpu:0", "/gpu:2"}}.chooseDevices(gpuMachine(2), task)
	require.Error(t, err)
	for _, want := range []string{"task worker:1", `"/gpu:2" does not exist`, localGPU(0), localGPU(1), strategy.LocalCPU(0)} {
		assert.ErrorContains(t, err, want)
	}
}

// The two-level all-reduce on GPUs, built (no machine that tests tfdist
// can run it): the packed gradients of 4 GPUs are summed by NCCL on the
// first, cross to the host once, go through the engine once, come back to
// the first GPU once and reach the others by NCCL's broadcast.
func TestTwoLevelAllReduceOnGPUsCrossesToTheHostOncePerPack(t *testing.T) {
	devices := []string{localGPU(0), localGPU(1), localGPU(2), localGPU(3)}
	host := strategy.LocalCPU(0)
	s := op.NewScope()
	values := make([][]tf.Output, len(devices))
	for r, d := range devices {
		rs := s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(d)
		for k, shape := range [][]int64{{64, 64}, {64}, {64, 10}} {
			values[r] = append(values[r], op.Placeholder(rs.SubScope(fmt.Sprint("grad_", k)), tf.Float, op.PlaceholderShape(tf.MakeShape(shape...))))
		}
	}
	cdo := ingraph.Packed{Inner: &engineOps{group: "g", host: host, replicas: 8, names: &opNames{}}, BytesPerPack: 32 << 20}
	out, err := cdo.BatchReduce(s.SubScope("reduce"), strategy.Mean, values, devices)
	require.NoError(t, err)
	require.Len(t, out, 4)
	g, err := s.Finalize()
	require.NoError(t, err)

	var toHost, toGPU, reduces, broadcasts int
	for _, o := range g.Operations() {
		switch o.Type() {
		case "NcclReduce":
			reduces++
			assert.Equal(t, devices[0], o.Device())
			assert.Equal(t, 4, o.NumInputs(), "one input per GPU")
		case "NcclBroadcast":
			broadcasts++
			assert.Equal(t, devices[0], o.Device())
		}
		for i := range o.NumOutputs() {
			for _, c := range o.Output(i).Consumers() {
				switch to := c.Op.Device(); {
				case tfrt.IsGPU(o.Device()) && to == host:
					toHost++
				case o.Device() == host && tfrt.IsGPU(to):
					toGPU++
				}
			}
		}
	}
	assert.Equal(t, 1, reduces, "one pack, one NCCL reduce")
	assert.Equal(t, 1, broadcasts, "one pack, one NCCL broadcast")
	assert.Equal(t, 1, toHost, "one pack crosses from a GPU to the host once")
	assert.Equal(t, 1, toGPU, "and back once")
}
