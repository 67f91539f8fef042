package multiworker

import (
	"fmt"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Communication chooses the collective implementation.
type Communication int

const (
	// Auto is tfdist's own engine, the default: the strategy's replicas
	// run on CPU devices, whose tensors the engine reads in place.
	Auto Communication = iota
	// Ring is TensorFlow's ring all-reduce over gRPC (CPU and GPU).
	Ring
	// NCCL is NVIDIA's NCCL; every device must be a GPU. Untested: no
	// machine that tests tfdist has a GPU.
	NCCL
	// Engine is tfdist's own collective engine (package collective): the
	// graph's collective ops hand their buffers to it, and it moves them
	// between worker processes over its own connections.
	Engine
)

// String returns the communication hint TensorFlow's collective ops take
// ("tfdist" for the engine, which they never see).
func (c Communication) String() string {
	switch c {
	case Ring:
		return "ring"
	case NCCL:
		return "nccl"
	case Engine:
		return "tfdist"
	}
	return "auto"
}

// CollectiveOps is the CrossDeviceOps of MultiWorkerMirrored: every replica
// on every worker joins TensorFlow's collective ops (CollectiveReduceV2,
// CollectiveGatherV2, CollectiveBcastSend/RecvV2) in one group of all
// replicas in sync. Instance keys are handed out in build order, so workers
// that build the same program agree on them without talking.
//
// The ops carry no timeout of their own: TensorFlow implements an op's
// timeout with a thread that sleeps for all of it, so a fast step loop would
// hold (collectives per second x timeout) threads. A dead peer is bounded by
// the deadline of the step that runs them instead (see
// WithCollectiveTimeout), whose cancellation aborts the step's collectives.
type CollectiveOps struct {
	GroupSize     int
	GroupKey      int32
	FirstReplica  int // global id of this process's first replica
	Communication Communication

	mu   sync.Mutex
	next int32
}

func (c *CollectiveOps) instanceKey() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return c.next
}

type collectiveArgs struct {
	size, group, instance tf.Output
}

func (c *CollectiveOps) args(s *op.Scope, key int32) collectiveArgs {
	return collectiveArgs{
		size:     op.Const(s.SubScope("group_size"), int32(c.GroupSize)),
		group:    op.Const(s.SubScope("group_key"), c.GroupKey),
		instance: op.Const(s.SubScope("instance_key"), key),
	}
}

func (c *CollectiveOps) hint(devices []string) string {
	if c.Communication == Auto {
		if strategy.RequireGPUs(devices) == nil {
			return "nccl"
		}
		return "ring"
	}
	return c.Communication.String()
}

func (c *CollectiveOps) check(devices []string) error {
	if c.Communication == NCCL {
		if err := strategy.RequireGPUs(devices); err != nil {
			return fmt.Errorf("multiworker: communication NCCL: %w", err)
		}
	}
	return nil
}

// BatchReduce implements strategy.CrossDeviceOps.
func (c *CollectiveOps) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check(devices); err != nil {
		return nil, err
	}
	final := "Id"
	if red == strategy.Mean {
		final = "Div"
	}
	out := make([][]tf.Output, len(values))
	for i := range values[0] {
		key := c.instanceKey()
		for r := range values {
			rs := s.SubScope(fmt.Sprintf("reduce_%d_replica_%d", i, r)).WithDevice(devices[r])
			a := c.args(rs, key)
			out[r] = append(out[r], op.CollectiveReduceV2(rs, values[r][i], a.size, a.group, a.instance, nil, "Add", final,
				op.CollectiveReduceV2CommunicationHint(c.hint(devices))))
		}
	}
	return out, s.Err()
}

// BatchGather implements strategy.CrossDeviceOps.
func (c *CollectiveOps) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check(devices); err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(values))
	for i := range values[0] {
		key := c.instanceKey()
		for r := range values {
			rs := s.SubScope(fmt.Sprintf("gather_%d_replica_%d", i, r)).WithDevice(devices[r])
			a := c.args(rs, key)
			out[r] = append(out[r], op.CollectiveGatherV2(rs, values[r][i], a.size, a.group, a.instance, nil,
				op.CollectiveGatherV2CommunicationHint(c.hint(devices))))
		}
	}
	return out, s.Err()
}

// Broadcast implements strategy.Broadcaster: global replica 0 sends, every
// other replica of every worker receives.
func (c *CollectiveOps) Broadcast(s *op.Scope, value tf.Output, devices []string) ([]tf.Output, error) {
	key := c.instanceKey()
	out := make([]tf.Output, len(devices))
	for r := range devices {
		rs := s.SubScope(fmt.Sprintf("bcast_replica_%d", r)).WithDevice(devices[r])
		a := c.args(rs, key)
		if c.FirstReplica+r == 0 {
			out[r] = op.CollectiveBcastSendV2(rs, value, a.size, a.group, a.instance,
				op.CollectiveBcastSendV2CommunicationHint(c.hint(devices)))
			continue
		}
		out[r] = op.CollectiveBcastRecvV2(rs, a.size, a.group, a.instance, op.Shape(rs.SubScope("shape"), value), value.DataType(),
			op.CollectiveBcastRecvV2CommunicationHint(c.hint(devices)))
	}
	return out, s.Err()
}
