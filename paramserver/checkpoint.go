package paramserver

import (
	"context"
	"sort"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// AppliedStepsKey is the checkpoint key of the applied-steps counter
// (AppliedSteps), saved and restored with the variables.
const AppliedStepsKey = "_paramserver/applied_steps"

// State returns the strategy's extension point for checkpoints (see
// strategy.State): checkpoint.NewSaver and checkpoint.NewManager save and
// restore the strategy through it, as they do every strategy.
//
// Every variable, every optimizer slot and the applied-steps counter is
// one tensor. Each ps task saves the shards it holds (SaveV2 on the task,
// so the variables never pass through the chief) and the chief merges the
// shards (MergeV2Checkpoints). A sharded variable is saved as one tensor of
// its whole shape, each shard as a slice of it, as TensorFlow saves
// partitioned variables: Python's tf.train.load_checkpoint reads it whole,
// and a restore reads it into any number of shards on any number of ps
// tasks.
//
// The ps tasks write to the checkpoint's directory on their own file
// system: on one machine, or with a shared file system. A save reads
// variables while scheduled steps may be updating them; Join the
// coordinator first for a checkpoint of one moment, and restore while no
// scheduled step runs, after Build has created the optimizer slots.
func (s *Strategy) State() strategy.State { return psState{s} }

type psState struct{ s *Strategy }

var _ strategy.State = psState{}

func (p psState) HostDevice() string { return p.s.host }

func (p psState) Extend(name string, build func(sc *op.Scope) error) error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	sc := s.newScope0(name)
	return graphutil.Safely(func() error {
		if err := build(sc); err != nil {
			return err
		}
		return sc.Err()
	})
}

func (p psState) Run(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation, after func()) ([]*tf.Tensor, error) {
	s := p.s
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	out, err := s.run0(ctx, feeds, fetches, targets)
	if err == nil && after != nil {
		after()
	}
	return out, err
}

func (p psState) Saveables() []strategy.Saveable {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []strategy.Saveable
	for _, v := range s.vars {
		sv := strategy.Saveable{Name: v.name, DType: v.dtype, Shape: v.shape, Variable: v}
		for _, sh := range v.shards {
			sv.Slices = append(sv.Slices, resourceSlice(sh.device, sh.sliceSpec(), sh.h0, v.dtype, &sh.inited))
		}
		out = append(out, sv)
	}
	for _, slot := range s.slotList {
		sv := strategy.Saveable{Name: slot.name, DType: slot.dtype, Shape: slot.full}
		for _, part := range slot.parts {
			sv.Slices = append(sv.Slices, resourceSlice(part.device, part.sliceSpec(slot.full), part.h0, slot.dtype, &part.inited))
		}
		out = append(out, sv)
	}
	out = append(out, s.appliedStepsSaveable())
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// resourceSlice is the slice of a checkpoint tensor that the resource
// variable h on device holds.
func resourceSlice(device, spec string, h tf.Output, dtype tf.DataType, inited *bool) strategy.SaveSlice {
	return strategy.SaveSlice{Device: device, Spec: spec,
		Read: func(sc *op.Scope) (tf.Output, error) {
			return op.ReadVariableOp(sc.WithDevice(device), h, dtype), nil
		},
		Write: func(sc *op.Scope, val tf.Output) ([]*tf.Operation, error) {
			return []*tf.Operation{op.AssignVariableOp(sc.WithDevice(device), h, val)}, nil
		},
		Restored: func() { *inited = true }}
}

// appliedStepsSaveable saves the total of the applied-steps counter (its
// element 0) and restores it with the per-worker counts zeroed.
func (s *Strategy) appliedStepsSaveable() strategy.Saveable {
	n := int64(len(s.workers))
	dev := s.ps[0]
	return strategy.Saveable{Name: AppliedStepsKey, DType: tf.Int64, Slices: []strategy.SaveSlice{{Device: dev,
		Read: func(sc *op.Scope) (tf.Output, error) {
			sc = sc.WithDevice(dev)
			first := op.Slice(sc.SubScope("first"), op.ReadVariableOp(sc.SubScope("read"), s.progress, tf.Int64),
				op.Const(sc.SubScope("begin"), []int64{0}), op.Const(sc.SubScope("size"), []int64{1}))
			return op.Reshape(sc.SubScope("scalar"), first, op.Const(sc.SubScope("shape"), []int32{})), nil
		},
		Write: func(sc *op.Scope, val tf.Output) ([]*tf.Operation, error) {
			sc = sc.WithDevice(dev)
			v := op.ConcatV2(sc.SubScope("value"), []tf.Output{op.Reshape(sc.SubScope("vector"), val, op.Const(sc.SubScope("shape"), []int32{1})),
				op.Const(sc.SubScope("zeros"), make([]int64, n))}, op.Const(sc.SubScope("axis"), int32(0)))
			return []*tf.Operation{op.AssignVariableOp(sc.SubScope("assign"), s.progress, v)}, nil
		},
		Restored: func() {}}}}
}
