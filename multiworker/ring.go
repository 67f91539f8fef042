package multiworker

import (
	"fmt"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/strategy"
)

// ringOps is the CrossDeviceOps of MultiWorkerMirrored on TensorFlow's
// collectives (WithCommunication Ring or NCCL, and a single worker's local
// devices): every replica on every worker joins TensorFlow's collective
// ops (CollectiveReduceV2, CollectiveGatherV2, CollectiveBcastSend/RecvV2)
// in one group of all replicas in sync, which TensorFlow's ring all-reduce
// over gRPC (or NCCL) runs. Instance keys are handed out in build order,
// so workers that build the same program agree on them without talking.
//
// The ops carry no timeout of their own: TensorFlow implements an op's
// timeout with a thread that sleeps for all of it, so a fast step loop would
// hold (collectives per second x timeout) threads. A dead peer is bounded by
// the deadline of the step that runs them instead (see
// WithCollectiveTimeout), whose cancellation aborts the step's collectives.
type ringOps struct {
	GroupSize     int
	GroupKey      int32
	FirstReplica  int // global id of this process's first replica
	Communication Communication

	mu   sync.Mutex
	next int32
}

func (c *ringOps) instanceKey() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return c.next
}

type ringArgs struct {
	size, group, instance tf.Output
}

func (c *ringOps) args(s *op.Scope, key int32) ringArgs {
	return ringArgs{
		size:     op.Const(s.SubScope("group_size"), int32(c.GroupSize)),
		group:    op.Const(s.SubScope("group_key"), c.GroupKey),
		instance: op.Const(s.SubScope("instance_key"), key),
	}
}

func (c *ringOps) hint(devices []string) string {
	if c.Communication == Auto {
		if ingraph.RequireGPUs(devices) == nil {
			return "nccl"
		}
		return "ring"
	}
	return c.Communication.String()
}

func (c *ringOps) check(devices []string) error {
	if c.Communication == NCCL {
		if err := ingraph.RequireGPUs(devices); err != nil {
			return fmt.Errorf("multiworker: communication NCCL: %w", err)
		}
	}
	return nil
}

// BatchReduce implements strategy.CrossDeviceOps.
func (c *ringOps) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
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
func (c *ringOps) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
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

// Broadcast implements ingraph.Broadcaster: global replica 0 sends, every
// other replica of every worker receives.
func (c *ringOps) Broadcast(s *op.Scope, value tf.Output, devices []string) ([]tf.Output, error) {
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
