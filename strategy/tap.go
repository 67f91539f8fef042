package strategy

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// A tap is an all-reduce whose gradient Gradients takes itself:
// TensorFlow's gradient registry has none for the collectives, so the
// result a replica sees stops the gradient, and Gradients sends the
// loss's gradient with respect to it through the same reduction back to
// every replica's input (tf.distribute's all_reduce gradient). Min and
// Max, and integer values, have no gradient.
type tap struct {
	red     ReduceOp
	in, out tf.Output
}

// tap returns the result out of the all-reduce of in, recorded as a tap
// when it has a gradient.
func (rc *ReplicaContext) tap(red ReduceOp, in, out tf.Output) (tf.Output, error) {
	if red != Sum && red != Mean || !isFloat(in.DataType()) {
		return out, nil
	}
	s := rc.scope.SubScope("all_reduce_tap")
	t := tap{red: red, in: in, out: op.StopGradient(s, out)}
	rc.taps = append(rc.taps, t)
	return t.out, s.Err()
}

// throughTaps returns the outputs and their initial gradients from which
// the gradients of loss flow through the replica's taps: loss itself, and
// each tap's input with the all-reduced gradient of loss with respect to
// the tap's result. It is a merge point: every replica all-reduces the
// gradients of its taps together, in one all-reduce.
func (rc *ReplicaContext) throughTaps(prefix string, loss tf.Output) (ys, dys []tf.Output, err error) {
	outs := make([]tf.Output, len(rc.taps))
	memo := map[string]bool{}
	var reached []int
	for i, t := range rc.taps {
		outs[i] = t.out
		if reaches(t.out, loss.Op.Name(), memo) {
			reached = append(reached, i)
		}
	}
	// The graph is the same on every replica, so every replica reaches
	// the same taps, and all or none take the merge point.
	if len(reached) == 0 {
		return []tf.Output{loss}, nil, nil
	}
	g, err := rc.e.graph.AddGradients(prefix+"_taps", []tf.Output{loss}, pick(outs, reached), nil)
	if err != nil {
		return nil, nil, err
	}
	s := rc.scope.SubScope("tap_gradients")
	flat := make([]tf.Output, len(g))
	for k := range g {
		ks := s.SubScope(fmt.Sprintf("tap_%d", k))
		flat[k] = op.Reshape(ks, op.Cast(ks.SubScope("float"), g[k], tf.Float), op.Const(ks.SubScope("minus_one"), []int32{-1}))
	}
	all := flat[0]
	if len(flat) > 1 {
		all = op.ConcatV2(s.SubScope("concat"), flat, op.Const(s.SubScope("axis"), int32(0)))
	}
	if err := s.Err(); err != nil {
		return nil, nil, err
	}
	summed, err := rc.allReduce(Sum, all, "GradientOfAllReduce")
	if err != nil {
		return nil, nil, err
	}
	ys, dys = []tf.Output{loss}, []tf.Output{op.OnesLike(s.SubScope("one"), loss)}
	for k, part := range splitLike(s.SubScope("split"), summed, g) {
		t, ks := rc.taps[reached[k]], s.SubScope(fmt.Sprintf("tap_%d", k))
		if t.red == Mean {
			part = op.Div(ks.SubScope("mean"), part, op.Const(ks.SubScope("n"), float32(rc.NumReplicasInSync())))
		}
		ys, dys = append(ys, t.in), append(dys, op.Cast(ks.SubScope("dtype"), part, t.in.DataType()))
	}
	return ys, dys, s.Err()
}

// reaches reports whether the op named to consumes out, directly or
// through other ops; memo holds what earlier calls found of each op.
func reaches(out tf.Output, to string, memo map[string]bool) bool {
	for _, c := range out.Consumers() {
		name := c.Op.Name()
		if name == to {
			return true
		}
		found, seen := memo[name]
		if !seen {
			memo[name] = false // a cycle (a loop's NextIteration) finds nothing new
			for k := range c.Op.NumOutputs() {
				if found = reaches(c.Op.Output(k), to, memo); found {
					break
				}
			}
			memo[name] = found
		}
		if found {
			return true
		}
	}
	return false
}

func pick(xs []tf.Output, idx []int) []tf.Output {
	out := make([]tf.Output, len(idx))
	for k, i := range idx {
		out[k] = xs[i]
	}
	return out
}

// splitLike splits flat, the concatenation of likes' elements, into
// tensors of likes' shapes.
func splitLike(s *op.Scope, flat tf.Output, likes []tf.Output) []tf.Output {
	sizes := make([]tf.Output, len(likes))
	for i, l := range likes {
		sizes[i] = op.Size(s.SubScope(fmt.Sprintf("size_%d", i)), l, op.SizeOutType(tf.Int32))
	}
	parts := []tf.Output{flat}
	if len(likes) > 1 {
		parts = op.SplitV(s, flat, op.Pack(s.SubScope("sizes"), sizes), op.Const(s.SubScope("axis"), int32(0)), int64(len(likes)))
	}
	for i := range parts {
		parts[i] = op.Reshape(s.SubScope(fmt.Sprintf("shape_%d", i)), parts[i], op.Shape(s.SubScope(fmt.Sprintf("like_%d", i)), likes[i]))
	}
	return parts
}

func isFloat(dt tf.DataType) bool {
	return dt == tf.Float || dt == tf.Double || dt == tf.Half || dt == tf.Bfloat16
}
