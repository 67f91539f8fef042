package multiworker

import (
	"math"
	"sort"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/strategy"
)

// residualPrefix prefixes the checkpoint keys of TopK's residuals, which
// no variable name can start with.
const residualPrefix = "_tfdist/topk_residual/"

// residual is TopK's error feedback for one gradient (or pack): a float32
// resource variable on the worker's host CPU holding what the worker has
// not sent yet. Each worker has its own.
type residual struct {
	name   string // checkpoint key
	handle tf.Output
	n      int64
	init   *tf.Operation
	inited bool
}

// residuals are a worker's TopK residuals, created as steps are built.
type residuals struct {
	group string // the collective group's id, for checkpoints' gathers
	mu    sync.Mutex
	list  []*residual
}

// add creates the residual of the all-reduce name, n elements: zero from
// the engine's next initialisation (pending), unless a checkpoint restores
// it first.
func (rs *residuals) add(s *op.Scope, name string, n int64) *residual {
	r := &residual{name: residualPrefix + name, n: n}
	r.handle = op.VarHandleOp(s, tf.Float, tf.MakeShape(n), op.VarHandleOpSharedName(r.name))
	zeros := op.Fill(s.SubScope("zeros"), op.Const(s.SubScope("dims"), []int64{n}), op.Const(s.SubScope("zero"), float32(0)))
	r.init = op.AssignVariableOp(s.SubScope("init"), r.handle, zeros)
	rs.mu.Lock()
	rs.list = append(rs.list, r)
	rs.mu.Unlock()
	return r
}

// pending returns the initialisers of the residuals that hold no value
// yet, which zero them, and a function that records that they ran: the
// engine runs them with its variables' (ingraph.Config.PendingInit).
func (rs *residuals) pending() ([]*tf.Operation, func()) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var pending []*residual
	var targets []*tf.Operation
	for _, r := range rs.list {
		if !r.inited {
			pending, targets = append(pending, r), append(targets, r.init)
		}
	}
	return targets, func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		for _, r := range pending {
			r.inited = true
		}
	}
}

// sparseSum is the all-reduce (sum) of sum under TopK(c.topK): the worker
// adds its residual, keeps the k elements largest in magnitude and the
// rest as its new residual, and every worker gathers every worker's k
// indices and values and adds them up, in rank order, into a dense
// result of sum's shape.
func (c *engineOps) sparseSum(s *op.Scope, name string, sum tf.Output, n int64) tf.Output {
	k := max(1, int64(math.Ceil(c.topK*float64(n))))
	r := c.residuals.add(s.SubScope("residual"), name, n)
	flat := op.Reshape(s.SubScope("flat"), sum, op.Const(s.SubScope("minus_one"), []int32{-1}))
	acc := op.AddV2(s.SubScope("acc"), flat, op.ReadVariableOp(s.SubScope("read_residual"), r.handle, tf.Float))
	idx := engineops.LargestIndices(s.SubScope("largest"), acc, k)
	vals := op.GatherV2(s.SubScope("values"), acc, idx, op.Const(s.SubScope("axis"), int32(0)))
	rest := op.TensorScatterUpdate(s.SubScope("rest"), acc, op.ExpandDims(s.SubScope("indices"), idx, op.Const(s.SubScope("last"), int32(-1))),
		op.ZerosLike(s.SubScope("sent"), vals))
	keep := s.WithControlDependencies(op.AssignVariableOp(s.SubScope("keep_residual"), r.handle, rest))
	allIdx := engineops.AllGather(keep.SubScope("gather_indices"), idx, c.group, name+"/indices")
	allVals := engineops.AllGather(keep.SubScope("gather_values"), vals, c.group, name+"/values")
	dense := op.UnsortedSegmentSum(s.SubScope("add"), allVals, allIdx, op.Const(s.SubScope("n"), int32(n)))
	return op.Reshape(s.SubScope("shape"), dense, op.Shape(s.SubScope("sum_shape"), sum))
}

// sparseSize returns the elements of v when its all-reduce goes through
// TopK (TopK is on and v is compressible), 0 when it does not.
func (c *engineOps) sparseSize(v tf.Output) int64 {
	if c.topK == 0 {
		return 0
	}
	return compressible(v)
}

// State returns the engine's checkpoint state (see ingraph.Engine.State)
// and, under TopK, every worker's residuals: saved as one [workers, n]
// tensor per residual, gathered from the workers at the save (every worker
// saves), each worker restoring its own row. Restored into another number
// of workers, every worker takes the rows' mean instead: what the workers
// had not yet sent, as a share of the all-reduced sum, stays the same
// (exactly so when each worker has as many replicas as before).
//
// Under WithLocalSGD, where every worker trains its own parameters and
// optimizer state between two synchronisations, a checkpoint holds each
// worker's copy of every variable besides the saving worker's (see
// workerCopiesState).
func (s *Strategy) State() strategy.State {
	st := s.engine.State()
	if s.residuals != nil {
		st = residualState{State: st, s: s}
	}
	if s.localSGD != nil && s.localSGD.group != "" {
		st = workerCopiesState{State: st, s: s}
	}
	return st
}

type residualState struct {
	strategy.State
	s *Strategy
}

func (rs residualState) Saveables() []strategy.Saveable {
	out := rs.State.Saveables()
	rs.s.residuals.mu.Lock()
	for _, r := range rs.s.residuals.list {
		out = append(out, rs.s.residualSaveable(r))
	}
	rs.s.residuals.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// residualRow builds this worker's residual from a saved [rows, n] tensor:
// its own row when the job saved it with as many workers, else the rows'
// mean.
func (s *Strategy) residualRow(sc *op.Scope, saved tf.Output) tf.Output {
	axis := op.Const(sc.SubScope("axis"), int32(0))
	rows := op.GatherV2(sc.SubScope("rows"), op.Shape(sc.SubScope("shape"), saved), axis, axis)
	last := op.Sub(sc.SubScope("last"), rows, op.Const(sc.SubScope("one"), int32(1)))
	row := op.Minimum(sc.SubScope("row"), op.Const(sc.SubScope("worker"), int32(s.workerID)), last)
	own := op.GatherV2(sc.SubScope("own"), saved, row, axis)
	mean := op.Mean(sc.SubScope("mean"), saved, axis)
	same := op.Equal(sc.SubScope("same"), rows, op.Const(sc.SubScope("workers"), int32(len(s.workers))))
	return op.Select(sc.SubScope("mine"), same, own, mean)
}

func (s *Strategy) residualSaveable(r *residual) strategy.Saveable {
	group := s.residuals.group
	return strategy.Saveable{Name: r.name, DType: tf.Float, Shape: []int64{int64(len(s.workers)), r.n}, AnyRows: true,
		Slices: []strategy.SaveSlice{{
			Device: s.engine.State().HostDevice(),
			Read: func(sc *op.Scope) (tf.Output, error) {
				row := op.Reshape(sc.SubScope("row"), op.ReadVariableOp(sc.SubScope("read"), r.handle, tf.Float),
					op.Const(sc.SubScope("shape"), []int64{1, r.n}))
				return engineops.AllGather(sc.SubScope("gather"), row, group, "save/"+r.name), sc.Err()
			},
			Write: func(sc *op.Scope, value tf.Output) ([]*tf.Operation, error) {
				return []*tf.Operation{op.AssignVariableOp(sc.SubScope("assign"), r.handle, s.residualRow(sc, value))}, sc.Err()
			},
			Restored: func() {
				s.residuals.mu.Lock()
				r.inited = true
				s.residuals.mu.Unlock()
			},
		}}}
}
