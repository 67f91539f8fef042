package optimizer

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// SparseSGD is stochastic gradient descent on the rows a step looked up:
// rows -= LearningRate * gradient (ResourceScatterSub), leaving every other
// row untouched. Give it with strategy.WithSparseOptimizer; the
// parameter-server strategy uses it for looked-up variables.
type SparseSGD struct {
	LearningRate float32
}

var _ strategy.SparseOptimizer = SparseSGD{}

// ApplySparse implements strategy.SparseOptimizer.
func (o SparseSGD) ApplySparse(s *op.Scope, handle, indices, values tf.Output, dtype tf.DataType) (*tf.Operation, error) {
	lr := op.Const(s.SubScope("lr"), o.LearningRate)
	if dtype != tf.Float {
		lr = op.Cast(s.SubScope("lr_cast"), lr, dtype)
	}
	up := op.ResourceScatterSub(s.SubScope("scatter_sub"), handle, indices, op.Mul(s.SubScope("scaled"), values, lr))
	return up, s.Err()
}
