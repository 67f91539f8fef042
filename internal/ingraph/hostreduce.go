package ingraph

import (
	"context"
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// hostReducer is a small graph, built once per kind of value, that feeds
// per-replica tensors to their devices and combines them with the strategy's
// CrossDeviceOps (so that, across workers, it is a collective like every
// other reduction).
type hostReducer struct {
	in  []tf.Output
	out tf.Output
	// all holds every replica's result op: each must run, since a
	// collective completes only when every member of its group joins.
	all []*tf.Operation
}

func (e *Engine) hostReducerLocked(kind string, dtype tf.DataType, rank int, build func(s *op.Scope, vals [][]tf.Output) ([][]tf.Output, error)) (*hostReducer, error) {
	key := fmt.Sprintf("%s/%v/%d", kind, dtype, rank)
	if h, ok := e.reducers[key]; ok {
		return h, nil
	}
	s := e.namespace("host_" + kind)
	h := &hostReducer{}
	err := graphutil.Safely(func() error {
		dims := make([]int64, rank)
		for i := range dims {
			dims[i] = -1
		}
		shape := tf.MakeShape(dims...)
		vals := make([][]tf.Output, len(e.cfg.Devices))
		for r, dev := range e.cfg.Devices {
			p := op.Placeholder(s.SubScope(fmt.Sprintf("in_%d", r)).WithDevice(dev), dtype, op.PlaceholderShape(shape))
			h.in = append(h.in, p)
			vals[r] = []tf.Output{p}
		}
		out, err := build(s.SubScope("combine"), vals)
		if err != nil {
			return err
		}
		h.out = op.Identity(s.SubScope("out").WithDevice(e.cfg.HostDevice), out[0][0])
		for r := range out {
			h.all = append(h.all, out[r][0].Op)
		}
		return s.Err()
	})
	if err != nil {
		return nil, err
	}
	e.reducers[key] = h
	return h, nil
}

func (e *Engine) combine(ctx context.Context, kind string, v strategy.PerReplica, build func(s *op.Scope, vals [][]tf.Output) ([][]tf.Output, error)) (*tf.Tensor, error) {
	if len(v) != len(e.cfg.Devices) {
		return nil, fmt.Errorf("strategy: %s: %d values, expected one per local replica (%d)", kind, len(v), len(e.cfg.Devices))
	}
	for r, t := range v {
		if t == nil {
			return nil, fmt.Errorf("strategy: %s: replica %d: nil tensor", kind, r)
		}
		if t.DataType() != v[0].DataType() || len(t.Shape()) != len(v[0].Shape()) {
			return nil, fmt.Errorf("strategy: %s: replica %d has %s%v, replica 0 has %s%v", kind, r,
				graphutil.DTypeName(t.DataType()), t.Shape(), graphutil.DTypeName(v[0].DataType()), v[0].Shape())
		}
	}
	if err := e.lock(ctx); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	// Reading no variable, it initialises them anyway: every worker's first
	// call then broadcasts the initial values, whichever call it is.
	if err := e.initPending(ctx); err != nil {
		return nil, err
	}
	h, err := e.hostReducerLocked(kind, v[0].DataType(), len(v[0].Shape()), build)
	if err != nil {
		return nil, fmt.Errorf("strategy: %s: %w", kind, err)
	}
	feeds := make(map[tf.Output]*tf.Tensor, len(v))
	for r, t := range v {
		feeds[h.in[r]] = t
	}
	out, err := e.runLocked(ctx, feeds, []tf.Output{h.out}, h.all)
	if err != nil {
		return nil, fmt.Errorf("strategy: %s: %w", kind, err)
	}
	return out[0], nil
}

// Reduce combines a per-replica value across all replicas in sync (across
// workers too, for multi-worker strategies, where every worker must call it
// in the same order). The reduction runs in TensorFlow.
func (e *Engine) Reduce(ctx context.Context, red strategy.ReduceOp, v strategy.PerReplica) (*tf.Tensor, error) {
	kind := "reduce_" + red.String()
	return e.combine(ctx, kind, v, func(s *op.Scope, vals [][]tf.Output) ([][]tf.Output, error) {
		return e.cfg.CrossDeviceOps.BatchReduce(s, red, vals, e.cfg.Devices)
	})
}

// errGatherScalar says why a gather refuses a scalar, as tf.distribute's
// gather does.
var errGatherScalar = errors.New("a gather concatenates along axis 0, so it needs values of rank 1 or more (reshape a scalar to [1])")

// Gather concatenates a per-replica value along axis 0 across all replicas in
// sync, in replica order; a scalar is an error.
func (e *Engine) Gather(ctx context.Context, v strategy.PerReplica) (*tf.Tensor, error) {
	if len(v) > 0 && v[0] != nil && len(v[0].Shape()) == 0 {
		return nil, fmt.Errorf("strategy: gather: replica 0's value is a scalar of %s: %w", graphutil.DTypeName(v[0].DataType()), errGatherScalar)
	}
	return e.combine(ctx, "gather", v, func(s *op.Scope, vals [][]tf.Output) ([][]tf.Output, error) {
		return e.cfg.CrossDeviceOps.BatchGather(s, vals, e.cfg.Devices)
	})
}

// LocalResults returns the values of this process's replicas.
func (e *Engine) LocalResults(v strategy.PerReplica) []*tf.Tensor { return []*tf.Tensor(v) }
