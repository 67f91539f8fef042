package ingraph

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// ReduceOutput declares an output of the step whose value is value summed
// (Sum) or averaged (Mean, over NumReplicasInSync) across every replica of
// every worker, computed in the step's own run. Build reduces all of a
// step's reduced outputs together with the strategy's CrossDeviceOps, once
// every replica has been traced, so every replica must declare the same
// ones.
//
// In a step that accumulates gradients (WithAccumulation), only the run
// that applies the update returns them: each is then the average of its
// values over the update's micro-steps, weighted by their examples as the
// gradients are — for a mean over the examples (a loss from AverageLoss),
// the mean over every example of the update. Such a value must be
// floating-point and of a fully known shape.
func (rc *ReplicaContext) ReduceOutput(name string, red strategy.ReduceOp, value tf.Output) error {
	return rc.reduced.Declare(name, red, value)
}

// ReducedOutputNames returns the names of the outputs the step declared
// with Replica.ReduceOutput, sorted.
func (st *step) ReducedOutputNames() []string { return append([]string(nil), st.redNames...) }

// buildReduced checks that every replica declared the same reduced outputs
// as replica 0 and builds them: one BatchReduce (Sum) of every declared
// output, then, for Mean, a division by the replicas in sync. Replica 0's
// results are fetched after the per-replica outputs; the other replicas'
// run as targets, since a collective completes only when every member
// joins.
func (e *Engine) buildReduced(root *op.Scope, st *step, rcs []*ReplicaContext, ab *accumBuild) error {
	first := rcs[0].reduced.List()
	if len(first) == 0 {
		for r := range rcs {
			if n := len(rcs[r].reduced.List()); n > 0 {
				return &strategy.BuildError{Replica: r, Err: fmt.Errorf("declares reduced outputs %v, replica 0 declares none", names(rcs[r].reduced.List()))}
			}
		}
		return nil
	}
	vals := make([][]tf.Output, len(rcs))
	for r, rc := range rcs {
		decl := rc.reduced.List()
		if err := sameReduced(first, decl); err != nil {
			return &strategy.BuildError{Replica: r, Err: err}
		}
		for _, o := range decl {
			vals[r] = append(vals[r], o.Value)
		}
	}
	s := root.SubScope("reduced_outputs")
	sums, err := e.reduceOutputs(s.SubScope("sum"), ab, first, vals)
	if err != nil {
		return &strategy.BuildError{Replica: -1, Err: fmt.Errorf("reduced outputs %v: %w", names(first), err)}
	}
	for k, o := range first {
		v := sums[0][k]
		if o.Op == strategy.Mean {
			ms := s.SubScope("mean_" + sanitize(o.Name)).WithDevice(e.cfg.Devices[0])
			n := op.Cast(ms.SubScope("n"), op.Const(ms.SubScope("replicas"), int32(e.cfg.NumReplicasInSync)), v.DataType())
			v = op.Div(ms, v, n)
		}
		st.redNames = append(st.redNames, o.Name)
		st.fetches = append(st.fetches, v)
		// In a step that accumulates, only the applying micro-step runs
		// them, and resets the accumulators after them.
		targets := &st.targets
		if ab.accumulates() {
			targets = &ab.apply
			ab.apply = append(ab.apply, v.Op)
		}
		for r := 1; r < len(sums); r++ {
			*targets = append(*targets, sums[r][k].Op)
		}
	}
	if err := s.Err(); err != nil {
		return &strategy.BuildError{Replica: -1, Err: fmt.Errorf("reduced outputs %v: %w", names(first), err)}
	}
	return nil
}

// reduceOutputs sums the replicas' reduced outputs, vals[r][k] the value
// of replica r's declaration k: with the CrossDeviceOps, or, in a step that
// accumulates, averaged over the examples of every micro-step of the
// update, weighted as the gradients are (reduceAccumulated), from
// accumulators named "accumulation/outputs/<name>".
func (e *Engine) reduceOutputs(s *op.Scope, ab *accumBuild, decl []strategy.ReducedOutput, vals [][]tf.Output) ([][]tf.Output, error) {
	if !ab.accumulates() {
		return e.cfg.CrossDeviceOps.BatchReduce(s, strategy.Sum, vals, e.cfg.Devices)
	}
	accs := make([]*variable, len(decl))
	for k, o := range decl {
		shape, err := o.Value.Shape().ToSlice()
		if err != nil || slices.Contains(shape, -1) {
			return nil, fmt.Errorf("reduced output %q: shape %v is not fully known; a step with WithAccumulation keeps its reduced outputs in variables", o.Name, o.Value.Shape())
		}
		if dt := o.Value.DataType(); dt != tf.Float && dt != tf.Double && dt != tf.Half && dt != tf.Bfloat16 {
			return nil, fmt.Errorf("reduced output %q: is %s; a step with WithAccumulation averages its reduced outputs over its micro-steps, which takes floating-point values", o.Name, graphutil.DTypeName(dt))
		}
		a, err := e.accumulator(ab, slotKey{owner: accumOwner, slot: accumOutputsSlot + o.Name}, accumOwner+"/"+accumOutputsSlot+o.Name, o.Value.DataType(), shape)
		if err != nil {
			return nil, err
		}
		accs[k] = a
	}
	return e.reduceAccumulated(s, ab, accs, vals)
}

// sameReduced returns an error naming the first reduced output in which
// decl differs from replica 0's declarations, want.
func sameReduced(want, decl []strategy.ReducedOutput) error {
	if len(decl) != len(want) {
		return fmt.Errorf("declares reduced outputs %v, replica 0 declares %v", names(decl), names(want))
	}
	for k, o := range decl {
		w := want[k]
		switch {
		case o.Name != w.Name:
			return fmt.Errorf("declares reduced outputs %v, replica 0 declares %v", names(decl), names(want))
		case o.Op != w.Op:
			return fmt.Errorf("reduced output %q: reduces with %v, replica 0 with %v", o.Name, o.Op, w.Op)
		case o.Value.DataType() != w.Value.DataType():
			return fmt.Errorf("reduced output %q: is %s, replica 0's is %s", o.Name, graphutil.DTypeName(o.Value.DataType()), graphutil.DTypeName(w.Value.DataType()))
		}
	}
	return nil
}

func names(outs []strategy.ReducedOutput) []string {
	n := make([]string, len(outs))
	for i, o := range outs {
		n[i] = o.Name
	}
	return n
}
