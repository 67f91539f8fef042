package ingraph

import (
	"context"
	"errors"
	"fmt"
	"sort"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// State returns the engine's extension point for checkpoints (see State).
// Each variable is one Saveable held whole and saved from the host device:
// an OnWrite variable from its primary copy, an OnRead variable as the
// aggregate of its copies across all replicas (their sum or mean, or copy 0
// for AggregationOnlyFirstReplica). A restore writes every local copy; an
// OnRead variable with AggregationSum gets value/replicas in each copy, so
// that its sum is the saved value, as in TensorFlow.
func (e *Engine) State() strategy.State { return engineState{e} }

type engineState struct{ e *Engine }

var _ strategy.State = engineState{}

func (s engineState) HostDevice() string { return s.e.cfg.HostDevice }

func (s engineState) Saveables() []strategy.Saveable {
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]strategy.Saveable, len(e.vars))
	for i, v := range e.vars {
		restored := func() { v.inited = true; e.forgetMicroSteps() }
		out[i] = strategy.Saveable{Name: v.name, DType: v.dtype, Shape: append([]int64(nil), v.shape...), Variable: v,
			Slices: []strategy.SaveSlice{{
				Device:   e.cfg.HostDevice,
				Read:     func(sc *op.Scope) (tf.Output, error) { return e.saveValue(sc, v) },
				Write:    func(sc *op.Scope, val tf.Output) ([]*tf.Operation, error) { return e.writeCopies(sc, v, val), nil },
				Restored: restored,
			}}}
		if e.savesCopies(v) {
			out[i].Copies = &strategy.ReplicaCopies{Replicas: e.cfg.NumReplicasInSync, SaveSlice: strategy.SaveSlice{
				Device:   e.cfg.HostDevice,
				Read:     func(sc *op.Scope) (tf.Output, error) { return e.saveCopies(sc, v) },
				Write:    func(sc *op.Scope, val tf.Output) ([]*tf.Operation, error) { return e.restoreCopies(sc, v, val), nil },
				Restored: restored,
			}}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s engineState) Extend(name string, build func(sc *op.Scope) error) error {
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("strategy: closed")
	}
	sc := e.namespace(name)
	return graphutil.Safely(func() error {
		if err := build(sc); err != nil {
			return err
		}
		return sc.Err()
	})
}

func (s engineState) Run(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation, after func()) ([]*tf.Tensor, error) {
	e := s.e
	if err := e.lock(ctx); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return nil, err
	}
	out, err := e.runLocked(ctx, feeds, fetches, targets)
	if err == nil && after != nil {
		after()
	}
	return out, err
}

// saveValue returns the value a checkpoint holds for v: what Value returns.
// An OnRead variable's aggregate depends on every replica's part of the
// reduction, so every part runs before the value is taken.
func (e *Engine) saveValue(sc *op.Scope, v *variable) (tf.Output, error) {
	out, all, err := e.aggregate(sc, v)
	if err != nil || len(all) == 0 {
		return out, err
	}
	return op.Identity(sc.SubScope("aggregated").WithControlDependencies(all...), out), nil
}

// aggregate builds v's value outside any replica: its primary copy, or the
// reduction of an OnRead variable's copies across all replicas, whose ops
// all must run.
func (e *Engine) aggregate(s *op.Scope, v *variable) (tf.Output, []*tf.Operation, error) {
	if v.shard != nil {
		out, err := e.gatherShards(s, v)
		return out, nil, err
	}
	read := func(r int) tf.Output {
		return op.ReadVariableOp(s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]), v.handles[r], v.dtype)
	}
	if v.sync == strategy.OnWrite || v.agg == strategy.AggregationOnlyFirstReplica || len(v.handles) == 1 && e.cfg.NumReplicasInSync == 1 {
		return read(0), nil, nil
	}
	if v.agg == strategy.AggregationNone {
		return tf.Output{}, nil, fmt.Errorf("variable %q is OnRead with aggregation NONE: it has no value outside a replica; "+
			"give it AggregationSum, AggregationMean or AggregationOnlyFirstReplica", v.name)
	}
	vals := make([][]tf.Output, len(v.handles))
	for r := range v.handles {
		vals[r] = []tf.Output{read(r)}
	}
	red, err := e.cfg.CrossDeviceOps.BatchReduce(s.SubScope("reduce"), reduceOpOf(v.agg), vals, e.cfg.Devices)
	if err != nil {
		return tf.Output{}, nil, fmt.Errorf("variable %q: %w", v.name, err)
	}
	all := make([]*tf.Operation, len(red))
	for r := range red {
		all[r] = red[r][0].Op
	}
	return red[0][0], all, nil
}

// savesCopies reports whether checkpoints hold each replica's copy of v
// besides its value: for an OnRead variable summed or averaged across
// several replicas in sync (a BatchNorm's moving statistics, which each
// replica moves with its own batches), so that a resumed job continues
// from the very copies it saved. Gradient accumulators, which the
// engine keeps, are saved by their value alone.
func (e *Engine) savesCopies(v *variable) bool {
	if v.sync != strategy.OnRead || e.cfg.NumReplicasInSync == 1 || v.agg != strategy.AggregationSum && v.agg != strategy.AggregationMean {
		return false
	}
	for _, acc := range e.slots {
		if acc == v {
			return false
		}
	}
	return true
}

// saveCopies builds the copies of v of every replica in sync, gathered
// across workers into rows in global replica order.
func (e *Engine) saveCopies(sc *op.Scope, v *variable) (tf.Output, error) {
	vals := make([][]tf.Output, len(v.handles))
	for r, h := range v.handles {
		rs := sc.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r])
		vals[r] = []tf.Output{op.ExpandDims(rs, op.ReadVariableOp(rs.SubScope("read"), h, v.dtype), op.Const(rs.SubScope("axis"), int32(0)))}
	}
	all, err := e.cfg.CrossDeviceOps.BatchGather(sc.SubScope("gather"), vals, e.cfg.Devices)
	if err != nil {
		return tf.Output{}, fmt.Errorf("variable %q: %w", v.name, err)
	}
	deps := make([]*tf.Operation, len(all))
	for r := range all {
		deps[r] = all[r][0].Op
	}
	return op.Identity(sc.SubScope("copies").WithDevice(e.cfg.HostDevice).WithControlDependencies(deps...), all[0][0]), nil
}

// restoreCopies gives each local replica its own row of copies, saved by
// saveCopies.
func (e *Engine) restoreCopies(sc *op.Scope, v *variable, copies tf.Output) []*tf.Operation {
	ops := make([]*tf.Operation, len(v.handles))
	for r, h := range v.handles {
		rs := sc.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r])
		row := op.Gather(rs.SubScope("row"), copies, op.Const(rs.SubScope("index"), int32(e.cfg.FirstReplicaID+r)))
		ops[r] = op.AssignVariableOp(rs, h, row)
	}
	return ops
}

// writeCopies assigns value to every local copy of v, divided by the number
// of replicas for an OnRead variable summed across replicas (TensorFlow's
// get_on_read_restore_ops).
func (e *Engine) writeCopies(sc *op.Scope, v *variable, value tf.Output) []*tf.Operation {
	if v.shard != nil {
		return e.writeShards(sc, v, value)
	}
	if n := e.cfg.NumReplicasInSync; v.sync == strategy.OnRead && v.agg == strategy.AggregationSum && n > 1 {
		value = divideBy(sc.SubScope("per_replica").WithDevice(e.cfg.HostDevice), value, v.dtype, n)
	}
	ops := make([]*tf.Operation, len(v.handles))
	for r, h := range v.handles {
		if o := e.holder(v, r); o != r {
			ops[r] = ops[o]
			continue
		}
		ops[r] = op.AssignVariableOp(sc.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]), h, value)
	}
	return uniqueOps(ops)
}

// divideBy returns x/n; integers are divided as Python's x / n, in double
// precision and cast back.
func divideBy(s *op.Scope, x tf.Output, dtype tf.DataType, n int) tf.Output {
	switch dtype {
	case tf.Float, tf.Double, tf.Half, tf.Bfloat16:
		return op.Div(s, x, op.Cast(s.SubScope("n"), op.Const(s.SubScope("count"), int32(n)), dtype))
	}
	d := op.Div(s, op.Cast(s.SubScope("to_double"), x, tf.Double), op.Const(s.SubScope("count"), float64(n)))
	return op.Cast(s.SubScope("back"), d, dtype)
}
