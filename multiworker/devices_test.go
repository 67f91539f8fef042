package multiworker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
)

// On 2 workers of 1, 2 and 4 devices (logical CPUs standing in for GPUs),
// the two-level all-reduce of tfdist's engine (each worker sums its
// replicas, and that sum crosses workers) ends 30 SGD steps with the
// default strategy's model and, from 2 devices on, with the flat
// all-reduce's (TensorFlow's ring, in which every replica of every worker
// is a member); and a worker sends the same bytes whatever its number of
// devices: one worker-sum per pack crosses workers, not one per replica.
func TestTwoLevelAllReduce(t *testing.T) {
	p := testmodel.Plan{Model: "mlp", Steps: 30, MicroBatches: []int{32}}
	want, err := testmodel.TrainDefault(context.Background(), optimizer.NewSGD(optimizer.Constant(0.1)), p)
	require.NoError(t, err)
	sent := map[int]int64{}
	for _, local := range []int{1, 2, 4} {
		var got testmodel.Outcome
		got, sent[local] = matchOnTwoWorkers(t, p, want, local)
		if local == 1 {
			continue
		}
		flat, _ := matchOnTwoWorkers(t, p, want, local, multiworker.WithCommunication(multiworker.Ring))
		d, at := testmodel.MaxVarDiff(flat, got)
		assert.Less(t, d, 1e-4, "%d devices per worker: two-level against flat, largest difference at %s", local, at)
	}
	t.Logf("bytes a worker sent in 30 steps, by devices per worker: %v", sent)
	assert.NotZero(t, sent[1])
	assert.Equal(t, sent[1], sent[2], "bytes sent by a worker of 2 devices, against one of 1")
	assert.Equal(t, sent[1], sent[4], "bytes sent by a worker of 4 devices, against one of 1")
}

// Workers with different numbers of devices are refused at start-up, on
// every worker and on both backends, with an error that names both
// workers and both counts.
func TestWorkersWithDifferentDeviceCounts(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			with := func(n int) []multiworker.Option {
				return []multiworker.Option{multiworker.WithCommunication(comm), multiworker.WithLogicalCPUs(n)}
			}
			errs := testcluster.OnWorkersWith(loopbackSpec(t, 2), func(w int) []multiworker.Option {
				return append(with(2+2*w), multiworker.WithStartupTimeout(20*time.Second))
			}, func(int, *multiworker.Strategy) error { return nil })
			require.Error(t, errs[0])
			require.Error(t, errs[1])
			assert.ErrorContains(t, errs[0], "task worker:0 has 2 replicas")
			assert.ErrorContains(t, errs[0], "task worker:1 has 4")
			assert.ErrorContains(t, errs[1], "task worker:1 has 4 replicas")
			assert.ErrorContains(t, errs[1], "task worker:0 has 2")
			assert.ErrorContains(t, errs[0], "every worker needs the same number")
		})
	}
}

// A device the worker does not have, and NCCL on CPU devices, are refused
// before the worker joins, naming the worker, the device and the devices
// that exist.
func TestDevicesTheWorkerLacks(t *testing.T) {
	for _, c := range []struct {
		opts []multiworker.Option
		want []string
	}{
		{[]multiworker.Option{multiworker.WithDevices("/gpu:0")},
			[]string{"task worker:0", `"/gpu:0" does not exist`, "/job:localhost/replica:0/task:0/device:CPU:0"}},
		{[]multiworker.Option{multiworker.WithLogicalCPUs(2), multiworker.WithDevices("/cpu:1", "/cpu:2")},
			[]string{"task worker:0", "device 1", `"/cpu:2" does not exist`, "device:CPU:1"}},
		{[]multiworker.Option{multiworker.WithLogicalCPUs(2), multiworker.WithCommunication(multiworker.NCCL)},
			[]string{"task worker:0", "WithCommunication(NCCL)", "NCCL needs every device to be a GPU"}},
	} {
		r, err := cluster.NewSimpleResolver(loopbackSpec(t, 2), cluster.Task{Type: cluster.Worker, Index: 0})
		require.NoError(t, err)
		start := time.Now()
		_, err = multiworker.New(context.Background(), append([]multiworker.Option{multiworker.WithResolver(r)}, c.opts...)...)
		require.Error(t, err)
		for _, w := range c.want {
			assert.ErrorContains(t, err, w)
		}
		assert.Less(t, time.Since(start), 10*time.Second, "refused before waiting for the peer")
	}
}
