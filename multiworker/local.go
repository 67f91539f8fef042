package multiworker

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/ingraph"
)

// On tfdist's engine a worker's all-reduce has two levels, as Horovod's
// hierarchical all-reduce and NCCL's do: the worker's local replicas are
// summed onto its host (sumOnHost), that one sum per tensor or pack
// crosses the workers on the engine, and the result goes back to every
// local replica (fromHost). The values that cross workers are one per
// worker, whatever its number of devices.
//
// On two or more GPUs the local levels are NCCL's (TensorFlow's NcclReduce
// and NcclBroadcast), so that a pack crosses between a GPU and the host
// once each way; no machine that tests tfdist has a GPU, so that path has
// only been built, never run. On CPU devices, which share the host's
// memory, the host sums and copies.

// column returns value k of every local replica.
func column(values [][]tf.Output, k int) []tf.Output {
	parts := make([]tf.Output, len(values))
	for r := range values {
		parts[r] = values[r][k]
	}
	return parts
}

// ncclLocal reports whether NCCL takes the local levels of a value of
// type dt on devices: two or more, every one a GPU, and a type NCCL's
// TensorFlow kernels take.
func ncclLocal(devices []string, dt tf.DataType) bool {
	if len(devices) < 2 || ingraph.RequireGPUs(devices) != nil {
		return false
	}
	switch dt {
	case tf.Half, tf.Float, tf.Double, tf.Int32, tf.Int64:
		return true
	}
	return false
}

// sumOnHost sums parts, one value of each local replica, into one tensor
// on host: with NCCL onto the first GPU, then one copy to the host; else
// with AddN on the host.
func sumOnHost(s *op.Scope, host string, parts []tf.Output, devices []string) tf.Output {
	hs := s.WithDevice(host)
	switch {
	case len(parts) == 1:
		return op.Identity(hs.SubScope("to_host"), parts[0])
	case ncclLocal(devices, parts[0].DataType()):
		sum := op.NcclReduce(s.SubScope("nccl_reduce").WithDevice(devices[0]), parts, "sum")
		return op.Identity(hs.SubScope("to_host"), sum)
	}
	return op.AddN(hs.SubScope("sum"), parts)
}

// concatOnHost concatenates parts, one value of each local replica, along
// their first axis on the host (s's device).
func concatOnHost(s *op.Scope, parts []tf.Output) tf.Output {
	if len(parts) == 1 {
		return op.Identity(s, parts[0])
	}
	return op.ConcatV2(s, parts, op.Const(s.SubScope("axis"), int32(0)))
}

// fromHost hands v, on the host, to every local replica's device: with
// NCCL, one copy to the first GPU and NCCL's broadcast from there, when
// v's shape is known; else a copy to each device.
func fromHost(s *op.Scope, v tf.Output, devices []string) []tf.Output {
	src := v
	if dims, known := graphutil.StaticShape(v); known && ncclLocal(devices, v.DataType()) {
		first := op.Identity(s.SubScope("to_device").WithDevice(devices[0]), v)
		src = op.NcclBroadcast(s.SubScope("nccl_broadcast").WithDevice(devices[0]), first, tf.MakeShape(dims...))
	}
	out := make([]tf.Output, len(devices))
	for r := range devices {
		out[r] = op.Identity(s.SubScope(fmt.Sprintf("to_%d", r)).WithDevice(devices[r]), src)
	}
	return out
}
