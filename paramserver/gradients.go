package paramserver

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Gradients returns the gradients of loss with respect to vars, each of its
// variable's whole shape: a variable the step reads has the gradient of its
// read; one it looks up has its looked-up rows' gradients summed into their
// rows and zero elsewhere (tf.convert_to_tensor of TensorFlow's
// IndexedSlices). The variables must be trainable, and the loss must
// depend on each.
func (rc *replicaContext) Gradients(loss tf.Output, vs []strategy.Variable) ([]tf.Output, error) {
	vars, err := rc.trainable("Gradients", vs)
	if err != nil {
		return nil, err
	}
	var xs []tf.Output
	for _, v := range vars {
		r, ls, err := rc.uses("Gradients", v)
		if err != nil {
			return nil, err
		}
		if r != nil {
			xs = append(xs, r.out)
			continue
		}
		for _, l := range ls {
			xs = append(xs, l.out)
		}
	}
	grads, err := rc.gradients("Gradients", loss, xs, vars)
	if err != nil {
		return nil, err
	}
	out := make([]tf.Output, len(vars))
	s := rc.scope.SubScope("gradients")
	for i, v := range vars {
		if rc.reads[v] != nil {
			out[i], grads = grads[0], grads[1:]
			continue
		}
		ls := rc.lookups[v]
		out[i] = rc.scatterRows(s.SubScope(fmt.Sprintf("var_%d", i)), v, ls, grads[:len(ls)])
		grads = grads[len(ls):]
	}
	return out, s.Err()
}

// scatterRows returns v's dense gradient from its lookups' rows' gradients
// grads, on the worker.
func (rc *replicaContext) scatterRows(s *op.Scope, v *Variable, ls []*lookup, grads []tf.Output) tf.Output {
	sums := make([]tf.Output, len(ls))
	for j, l := range ls {
		ls := s.SubScope(fmt.Sprintf("lookup_%d", j))
		sums[j] = op.UnsortedSegmentSum(ls, rc.rows(ls, l, grads[j]), l.flat, op.Const(ls.SubScope("num_rows"), v.shape[0]))
	}
	if len(sums) == 1 {
		return sums[0]
	}
	return op.AddN(s.SubScope("sum"), sums)
}

// ApplyGradients applies grads, one per variable of its whole shape (as
// Gradients returns them), to vars on their ps tasks with opt: each
// shard takes its rows of the gradient, and opt's slots live beside it.
// As Minimize's, the update is this worker's own, applied as soon as it is
// computed, and guarded: a step run again after its worker died applies it
// only if the first run did not. Of opts, none applies: gradient
// accumulation is refused, and a sparse optimizer needs Minimize.
func (rc *replicaContext) ApplyGradients(opt strategy.Optimizer, grads []tf.Output, vs []strategy.Variable, opts ...strategy.MinimizeOption) error {
	mc, err := strategy.NewMinimizeConfig(opts...)
	if err != nil {
		return fmt.Errorf("ApplyGradients: %w", err)
	}
	if mc.Accumulation > 1 {
		return fmt.Errorf("ApplyGradients: WithAccumulation(%d): gradient accumulation is not supported under the parameter-server strategy, whose workers apply their steps asynchronously", mc.Accumulation)
	}
	vars, err := rc.trainable("ApplyGradients", vs)
	if err != nil {
		return err
	}
	if len(grads) != len(vars) {
		return fmt.Errorf("ApplyGradients: %d gradients for %d variables", len(grads), len(vars))
	}
	if err := checkOptimizer(opt, true); err != nil {
		return err
	}
	s := rc.root.SubScope("apply")
	var shards []*shard
	var parts []tf.Output
	for i, v := range vars {
		if err := checkGradient(v, grads[i]); err != nil {
			return err
		}
		shards = append(shards, v.shards...)
		parts = append(parts, rc.shardRows(s.SubScope(fmt.Sprintf("split_%d", i)), v, grads[i])...)
	}
	pred, err := rc.makeGuard(grads)
	if err != nil {
		return err
	}
	if err := rc.applyDense(s, opt, shards, parts, pred); err != nil {
		return err
	}
	return s.Err()
}

// checkGradient refuses a gradient that is not a tensor of v's type and,
// where the graph knows it, of its shape.
func checkGradient(v *Variable, g tf.Output) error {
	if g.Op == nil {
		return fmt.Errorf("ApplyGradients: the gradient of %q is a zero tf.Output; expected a tensor of its shape %v", v.name, v.shape)
	}
	if g.DataType() != v.dtype {
		return fmt.Errorf("ApplyGradients: the gradient of %q is %s; expected the variable's %s", v.name, graphutil.DTypeName(g.DataType()), graphutil.DTypeName(v.dtype))
	}
	if shape, err := g.Shape().ToSlice(); err == nil && !slices.Contains(shape, -1) && !slices.Equal(shape, v.shape) {
		return fmt.Errorf("ApplyGradients: the gradient of %q has shape %v; expected the variable's %v", v.name, shape, v.shape)
	}
	return nil
}

// shardRows returns g, a gradient of v's whole shape, as each shard's rows
// of it.
func (rc *replicaContext) shardRows(s *op.Scope, v *Variable, g tf.Output) []tf.Output {
	if len(v.shards) == 1 {
		return []tf.Output{g}
	}
	sizes := make([]int64, len(v.shards))
	for k, sh := range v.shards {
		sizes[k] = sh.rows
	}
	ws := s.WithDevice(rc.w.device)
	return op.SplitV(ws, g, op.Const(ws.SubScope("sizes"), sizes), op.Const(ws.SubScope("axis"), int32(0)), int64(len(sizes)))
}
