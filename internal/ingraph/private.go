package ingraph

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// privateGradients returns the sums over this replica's examples of each
// example's gradients of loss (one value per example) with respect to
// vars, clipped by po. The loss is padded to po.MaxExamples() values, so
// that each example's gradient is a graph of its own whatever the batch's
// size; an assertion fails the step when the batch holds more.
func (rc *ReplicaContext) privateGradients(po strategy.PrivateOptimizer, loss tf.Output, vars []strategy.Variable) ([]tf.Output, error) {
	n := po.MaxExamples()
	if n < 1 {
		return nil, fmt.Errorf("DP-SGD: at most %d examples per replica: expected at least 1", n)
	}
	if shape, err := loss.Shape().ToSlice(); err != nil || len(shape) != 1 {
		return nil, fmt.Errorf("DP-SGD: the loss %q has shape %v; expected one value per example of the replica's batch, shape [batch]", loss.Op.Name(), loss.Shape())
	} else if shape[0] > int64(n) {
		return nil, fmt.Errorf("DP-SGD: the loss %q holds %d examples, more than the %d per replica the optimizer allows", loss.Op.Name(), shape[0], n)
	}
	if len(rc.taps) > 0 {
		return nil, errors.New("DP-SGD with a loss that may depend on an AllReduce (a synchronized BatchNorm, say): an example's gradient cannot pass through it on its own")
	}
	s := rc.scope.SubScope("dp_sgd")
	padded := padExamples(s.SubScope("pad"), loss, n)
	var sums []tf.Output
	for i := range n {
		es := s.SubScope(fmt.Sprintf("example_%d", i))
		li := op.Slice(es, padded, op.Const(es.SubScope("begin"), []int32{int32(i)}), op.Const(es.SubScope("size"), []int32{1}))
		g, err := rc.gradients(li, vars, false)
		if err != nil {
			return nil, err
		}
		clipped := po.ClipExample(es.SubScope("clip"), g)
		if sums == nil {
			sums = clipped
			continue
		}
		for k := range sums {
			sums[k] = op.Add(es.SubScope(fmt.Sprintf("sum_%d", k)), sums[k], clipped[k])
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("DP-SGD: %w", err)
	}
	if len(sums) != len(vars) {
		return nil, errors.New("DP-SGD: the optimizer clipped the gradients into a different number of tensors")
	}
	return sums, nil
}

// padExamples pads the per-example loss with zeros to n values, and fails
// the run when it holds more than n.
func padExamples(s *op.Scope, loss tf.Output, n int) tf.Output {
	size := op.Size(s.SubScope("size"), loss, op.SizeOutType(tf.Int32))
	limit := op.Const(s.SubScope("limit"), int32(n))
	ok := op.LessEqual(s.SubScope("fits"), size, limit)
	assert := op.Assert(s.SubScope("assert"), ok, []tf.Output{
		op.Const(s.SubScope("message"), fmt.Sprintf("DP-SGD: a batch of this replica holds more examples than the optimizer allows (MaxExamples %d):", n)), size})
	s = s.WithControlDependencies(assert)
	zero := op.Const(s.SubScope("zero"), int32(0))
	paddings := op.Reshape(s.SubScope("paddings"), op.Pack(s.SubScope("pack"), []tf.Output{zero, op.Sub(s.SubScope("rest"), limit, size)}),
		op.Const(s.SubScope("shape"), []int32{1, 2}))
	return op.Pad(s, loss, paddings)
}
