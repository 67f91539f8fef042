package strategy

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// CrossDeviceOps combines values across replicas, as tf.distribute's
// CrossDeviceOps does. values[r][k] is tensor k of local replica r, placed on
// devices[r]; the result has the same layout, each result on its replica's
// device. mirrored.WithCrossDeviceOps takes one; the strategies bring their own
// (one device, NCCL, TensorFlow's collective ops).
type CrossDeviceOps interface {
	// BatchReduce reduces each tensor k across replicas.
	BatchReduce(s *op.Scope, red ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error)
	// BatchGather concatenates each tensor k across replicas along axis 0,
	// in replica order.
	BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error)
}
