package multiworker

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/strategy"
)

// warmup is the GradientReducer of local SGD with WarmupSteps: a training
// step in the warm-up sums its gradients across every worker's replicas,
// as a synchronous step does, and takes the mean over the workers of each
// one's sum (a worker's gradients are of its mean loss); any other step
// sums them across this worker's replicas. One built step serves both: the
// gradients go one way or the other through a Switch on whether the count
// of training steps before the run is below WarmupSteps, so that a run out
// of the warm-up sends nothing.
type warmup struct {
	local, cross strategy.CrossDeviceOps
	workers      int
	// on is, while a training step builds, whether it runs in the warm-up
	// (a boolean on the host); outside, none, and the gradients stay local
	// (the outer update's).
	on tf.Output
}

// ReduceGradients implements ingraph.GradientReducer.
func (w *warmup) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if w.on.Op == nil {
		return w.local.BatchReduce(s, strategy.Sum, values, devices)
	}
	alone := make([][]tf.Output, len(values))
	synced := make([][]tf.Output, len(values))
	for r, vs := range values {
		rs := s.SubScope(fmt.Sprintf("warmup_switch_%d", r)).WithDevice(devices[r])
		for k, v := range vs {
			f, t := op.Switch(rs.SubScope(fmt.Sprint(k)), v, w.on)
			alone[r], synced[r] = append(alone[r], f), append(synced[r], t)
		}
	}
	mine, err := w.local.BatchReduce(s.SubScope("local"), strategy.Sum, alone, devices)
	if err != nil {
		return nil, err
	}
	all, err := w.cross.BatchReduce(s.SubScope("warmup"), strategy.Sum, synced, devices)
	if err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(values))
	for r := range values {
		rs := s.SubScope(fmt.Sprintf("warmup_merge_%d", r)).WithDevice(devices[r])
		for k, sum := range all[r] {
			ks := rs.SubScope(fmt.Sprint(k))
			share := graphutil.CastTo(ks, op.Const(ks.SubScope("share"), float32(1)/float32(w.workers)), sum.DataType())
			merged, _ := op.Merge(ks.SubScope("merge"), []tf.Output{mine[r][k], op.Mul(ks.SubScope("mean"), sum, share)})
			out[r] = append(out[r], merged)
		}
	}
	return out, s.Err()
}

// building calls fn, a replica's part of a step whose count of training
// steps before the run is before, with w.on set while replica 0's builds:
// the merge points, where the gradients are reduced, come before it
// returns.
func (w *warmup) building(rc *ingraph.ReplicaContext, before tf.Output, steps int, fn func() (strategy.Outputs, error)) (strategy.Outputs, error) {
	if w == nil {
		return fn()
	}
	if rc.LocalReplica() != 0 {
		return fn()
	}
	hs := rc.Scope().SubScope("local_sgd_warmup").WithDevice(strategy.LocalCPU(0))
	w.on = op.Less(hs, before, op.Const(hs.SubScope("steps"), int64(steps)))
	defer func() { w.on = tf.Output{} }()
	return fn()
}
