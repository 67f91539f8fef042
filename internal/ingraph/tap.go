package ingraph

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// A tap is an all-reduce whose gradient Gradients takes itself:
// TensorFlow's gradient registry has none for the collectives, so the
// result a replica sees stops the gradient, and Gradients sends the
// loss's gradient with respect to it through the same reduction back to
// every replica's input (tf.distribute's all_reduce gradient). Min and
// Max, and integer values, have no gradient.
type tap struct {
	red     strategy.ReduceOp
	in, out tf.Output
}

// tap returns the result out of the all-reduce of in, recorded as a tap
// when it has a gradient.
func (rc *ReplicaContext) tap(red strategy.ReduceOp, in, out tf.Output) (tf.Output, error) {
	if red != strategy.Sum && red != strategy.Mean || !graphutil.IsFloat(in.DataType()) {
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
// the tap's result. The taps are taken from the last to the first, since
// an earlier tap's result reaches the loss through the later ones too:
// each gradient is all-reduced, a merge point, before the earlier taps'
// are taken.
func (rc *ReplicaContext) throughTaps(prefix string, loss tf.Output) (ys, dys []tf.Output, err error) {
	memo := map[string]bool{}
	ys, dys = []tf.Output{loss}, []tf.Output{op.OnesLike(rc.scope.SubScope("tap_gradients_one"), loss)}
	// The graph is the same on every replica, so every replica reaches
	// the same taps and takes the same merge points.
	for i := len(rc.taps) - 1; i >= 0; i-- {
		t := rc.taps[i]
		if !reaches(t.out, loss.Op.Name(), memo) {
			continue
		}
		g, err := rc.e.graph.AddGradients(fmt.Sprintf("%s_tap_%d", prefix, i), ys, []tf.Output{t.out}, dys)
		if err != nil {
			return nil, nil, err
		}
		dy, err := rc.reduceTapGradient(t, g[0], i)
		if err != nil {
			return nil, nil, err
		}
		ys, dys = append(ys, t.in), append(dys, dy)
	}
	return ys, dys, nil
}

// reduceTapGradient returns the gradient g with respect to tap i's result
// all-reduced across the replicas as the tap's input needs it.
func (rc *ReplicaContext) reduceTapGradient(t tap, g tf.Output, i int) (tf.Output, error) {
	s := rc.scope.SubScope(fmt.Sprintf("tap_gradient_%d", i))
	if g.Op == nil {
		g = op.ZerosLike(s.SubScope("zeros"), t.out)
	}
	if err := s.Err(); err != nil {
		return tf.Output{}, err
	}
	sum, err := rc.allReduce(strategy.Sum, g, "GradientOfAllReduce")
	if err != nil {
		return tf.Output{}, err
	}
	if t.red == strategy.Mean {
		n := op.Cast(s.SubScope("n"), op.Const(s.SubScope("replicas"), float32(rc.NumReplicasInSync())), sum.DataType())
		sum = op.Div(s.SubScope("mean"), sum, n)
	}
	return sum, s.Err()
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
