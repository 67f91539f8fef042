package tfrt

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	pb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"google.golang.org/protobuf/proto"
)

// ConfigOption sets a field of a session's ConfigProto.
type ConfigOption func(*pb.ConfigProto)

// WithLogicalCPUs makes the process show n CPU devices (/device:CPU:0 …
// /device:CPU:n-1) that share the machine's cores: how tfdist stands in for
// several accelerators on a machine that has none.
func WithLogicalCPUs(n int) ConfigOption {
	return func(c *pb.ConfigProto) {
		if c.DeviceCount == nil {
			c.DeviceCount = map[string]int32{}
		}
		c.DeviceCount["CPU"] = int32(n)
	}
}

// WithThreads sets the intra-op and inter-op thread pool sizes; 0 leaves
// TensorFlow's default (the number of cores).
func WithThreads(intraOp, interOp int) ConfigOption {
	return func(c *pb.ConfigProto) {
		c.IntraOpParallelismThreads = int32(intraOp)
		c.InterOpParallelismThreads = int32(interOp)
	}
}

// WithoutThreadSpinning makes TensorFlow's thread pools sleep as soon as
// they run out of work instead of spinning first. A worker whose steps wait
// on the network (tfdist's collective ops) leaves the cores to the
// goroutines that move its tensors.
func WithoutThreadSpinning() ConfigOption {
	return func(c *pb.ConfigProto) {
		if c.Experimental == nil {
			c.Experimental = &pb.ConfigProto_Experimental{}
		}
		c.Experimental.DisableThreadSpinning = true
	}
}

// WithStepsOnCallerThread makes a session whose graph lies on one device
// run each step's ops on the thread that calls Run, as TensorFlow advises
// for graphs whose steps are short (inter_op_parallelism_threads -1): a
// step starts without handing off to the inter-op pool, and what follows
// an async kernel runs on the thread that completes it. Ops still use the
// intra-op pool. A graph over several devices runs on the inter-op pool
// as before. It overrides WithThreads' inter-op size.
func WithStepsOnCallerThread() ConfigOption {
	return func(c *pb.ConfigProto) { c.InterOpParallelismThreads = -1 }
}

// WithCollectiveGroupLeader names the task that leads collective groups, e.g.
// "/job:worker/replica:0/task:0", for CollectiveReduceV2 across tasks.
func WithCollectiveGroupLeader(task string) ConfigOption {
	return func(c *pb.ConfigProto) {
		if c.Experimental == nil {
			c.Experimental = &pb.ConfigProto_Experimental{}
		}
		c.Experimental.CollectiveGroupLeader = task
	}
}

// WithSoftPlacement lets TensorFlow move an op to another device when the
// requested one lacks a kernel. tfdist leaves it off by default so that a
// wrong device is an error rather than a silent move.
func WithSoftPlacement(on bool) ConfigOption {
	return func(c *pb.ConfigProto) { c.AllowSoftPlacement = on }
}

// WithOperationTimeout bounds every blocking operation of a session (in
// particular a collective or a receive whose peer is gone); 0 means none.
func WithOperationTimeout(d time.Duration) ConfigOption {
	return func(c *pb.ConfigProto) { c.OperationTimeoutInMs = d.Milliseconds() }
}

// WithClusterDef restricts a session on a distributed target to the given
// cluster view (used by the coordinator of parameter-server training).
func WithClusterDef(def *pb.ClusterDef) ConfigOption {
	return func(c *pb.ConfigProto) { c.ClusterDef = def }
}

// WithDeviceFilters limits the devices a session on a distributed target sees,
// e.g. "/job:ps", "/job:worker/task:1".
func WithDeviceFilters(filters ...string) ConfigOption {
	return func(c *pb.ConfigProto) { c.DeviceFilters = append(c.DeviceFilters, filters...) }
}

// NewConfig returns a ConfigProto with opts applied.
func NewConfig(opts ...ConfigOption) *pb.ConfigProto {
	c := &pb.ConfigProto{}
	for _, o := range opts {
		o(c)
	}
	return c
}

// SessionOptions encodes a ConfigProto built from opts for a session on target
// ("" for the local in-process runtime).
func SessionOptions(target string, opts ...ConfigOption) (*tf.SessionOptions, error) {
	return Configure(&tf.SessionOptions{Target: target}, opts...)
}

// Configure returns so (nil: the in-process runtime with TensorFlow's
// defaults) with opts applied to its ConfigProto; so is left as it is.
func Configure(so *tf.SessionOptions, opts ...ConfigOption) (*tf.SessionOptions, error) {
	c, target := &pb.ConfigProto{}, ""
	if so != nil {
		if err := proto.Unmarshal(so.Config, c); err != nil {
			return nil, fmt.Errorf("decode ConfigProto: %w", err)
		}
		target = so.Target
	}
	for _, o := range opts {
		o(c)
	}
	buf, err := proto.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode ConfigProto: %w", err)
	}
	return &tf.SessionOptions{Target: target, Config: buf}, nil
}

// DefaultThreads returns the thread counts tfdist uses when none are given:
// TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS where the environment
// sets them, as TensorFlow reads them, else TensorFlow's defaults, except
// that on a machine with few cores the inter-op pool gets at least two
// threads so that replicas on logical devices run side by side. A value
// that is not a positive number is an error naming it.
func DefaultThreads() (intraOp, interOp int, err error) {
	n := runtime.NumCPU()
	if intraOp, err = envThreads("TF_NUM_INTRAOP_THREADS", n); err != nil {
		return 0, 0, err
	}
	interOp, err = envThreads("TF_NUM_INTEROP_THREADS", max(n, 2))
	return intraOp, interOp, err
}

// ResolveThreads returns intraOp and interOp, a count of 0 replaced by
// DefaultThreads'.
func ResolveThreads(intraOp, interOp int) (int, int, error) {
	if intraOp > 0 && interOp > 0 {
		return intraOp, interOp, nil
	}
	di, dn, err := DefaultThreads()
	return cmp.Or(max(intraOp, 0), di), cmp.Or(max(interOp, 0), dn), err
}

// envThreads returns the thread count the environment variable name
// gives, or def where it is unset.
func envThreads(name string, def int) (int, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: expected a positive number of threads", name, v)
	}
	return n, nil
}

// WithoutGraphRewrites turns off Grappler, TensorFlow's graph optimizer,
// for the session: its arithmetic optimizer may regroup a tree of
// additions into one AddN and so change a sum's bits, and its other passes
// may decide otherwise on the graphs of different topologies. It also
// takes most of the time of a new graph's first run, which an elastic job
// pays at every change of members.
func WithoutGraphRewrites() ConfigOption {
	return func(c *pb.ConfigProto) {
		if c.GraphOptions == nil {
			c.GraphOptions = &pb.GraphOptions{}
		}
		if c.GraphOptions.RewriteOptions == nil {
			c.GraphOptions.RewriteOptions = &pb.RewriterConfig{}
		}
		c.GraphOptions.RewriteOptions.DisableMetaOptimizer = true
	}
}
