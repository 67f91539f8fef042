package ingraph

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Sharding shards the optimizer state of synchronous steps across the
// workers (ZeRO): the gradients are packed into the buckets the
// unsharded all-reduce packs them into, each bucket is reduce-scattered,
// each worker updates only its block of each bucket, keeping the
// optimizer's slots for that block alone, and the updated blocks are
// all-gathered into every worker's copies of the variables. Each reduced
// element has the bits the unsharded all-reduce gives it, so an
// elementwise optimizer (SGD, Momentum, Adam) updates the variables as
// it would unsharded, bit for bit.
//
// In a step that accumulates gradients (WithAccumulation), stage 1 keeps
// whole accumulators, as an unsharded step does, and reduce-scatters
// their sums in the applying run; stage 2 reduce-scatters every
// micro-step's gradients and accumulates only this worker's blocks.
type Sharding interface {
	// Stage returns 1 or 2 (see Sharding).
	Stage() int
	// Buckets returns the packing of the unsharded all-reduce, whose plan
	// makes the buckets (Inner is not used).
	Buckets() Packed
	// Block returns the first element and the length of this worker's
	// block of a bucket of elems elements.
	Block(elems int64) (start, n int64)
	// ReduceScatter sums parts, one flat bucket of each local replica,
	// across every replica of every worker, and returns this worker's
	// block of the sum (Block), a vector on the host.
	ReduceScatter(s *op.Scope, parts []tf.Output, devices []string) (tf.Output, error)
	// AllGatherBlocks returns on the host the whole bucket of elems
	// elements, made of every worker's block; this worker's is block.
	AllGatherBlocks(s *op.Scope, block tf.Output, elems int64) (tf.Output, error)
	// Gather returns on the host every worker's x, vectors of any
	// lengths, concatenated in rank order.
	Gather(s *op.Scope, x tf.Output) (tf.Output, error)
	// SumAcross returns x, on the host, summed across the workers.
	SumAcross(s *op.Scope, x tf.Output) (tf.Output, error)
}

// shard is the part of a variable that this worker holds of a slot under
// Sharding: n elements of its flattening from lo, possibly none.
type shard struct{ lo, n int64 }

// bucket is one bucket of a sharded step: the step's variables idx, of
// sizes elements, packed in that order, and this worker's block of it.
type bucket struct {
	idx    []int
	sizes  []int64
	elems  int64
	block  shard
	shards []shard // per variable of idx, its part of block
}

// planShards cuts the gradients grads of vars into the buckets of the
// unsharded all-reduce and each variable into this worker's shard.
func (e *Engine) planShards(vars []*variable, grads []tf.Output) ([]bucket, error) {
	sh := e.cfg.Sharding
	var out []bucket
	for _, pk := range sh.Buckets().plan(grads) {
		b := bucket{idx: pk.idx}
		for _, i := range pk.idx {
			n, err := elements(vars[i])
			if err != nil {
				return nil, err
			}
			b.sizes = append(b.sizes, n)
			b.elems += n
		}
		b.block.lo, b.block.n = sh.Block(b.elems)
		at := int64(0)
		for _, n := range b.sizes {
			lo, hi := max(at, b.block.lo), min(at+n, b.block.lo+b.block.n)
			if hi < lo {
				lo, hi = at, at
			}
			b.shards = append(b.shards, shard{lo: lo - at, n: hi - lo})
			at += n
		}
		out = append(out, b)
	}
	return out, nil
}

// elements returns the number of elements of v, whose shape must be known
// for its optimizer state to be sharded.
func elements(v *variable) (int64, error) {
	n := int64(1)
	for _, d := range v.shape {
		if d < 0 {
			return 0, fmt.Errorf("variable %q has shape %v; sharded optimizer state needs every dimension known", v.name, v.shape)
		}
		n *= d
	}
	return n, nil
}

// shardView is the variable an optimizer updates under Sharding: this
// worker's shard of a trained variable, a vector, named as the whole
// variable is (so that the optimizer's exclusions match it, and its slots
// take the whole variable's names), kept in a working copy per local
// replica that each step fills from the variable.
type shardView struct {
	v       *variable
	shard   shard
	scratch []tf.Output // per local replica
}

var _ strategy.Variable = (*shardView)(nil)

func (w *shardView) Name() string                              { return w.v.name }
func (w *shardView) DType() tf.DataType                        { return w.v.dtype }
func (w *shardView) Shape() []int64                            { return []int64{w.shard.n} }
func (w *shardView) Synchronization() strategy.Synchronization { return w.v.sync }
func (w *shardView) Aggregation() strategy.Aggregation         { return w.v.agg }
func (w *shardView) Trainable() bool                           { return w.v.trainable }
func (w *shardView) String() string {
	return fmt.Sprintf("%s[%d:%d]:%v", w.v.name, w.shard.lo, w.shard.lo+w.shard.n, w.v.dtype)
}

// view returns v's shard view, made on first use; a variable is cut the
// same way by every step that trains it.
func (e *Engine) view(v *variable, sh shard) (*shardView, error) {
	if w, ok := e.views[v]; ok {
		if w.shard != sh {
			return nil, fmt.Errorf("variable %q: its optimizer state is sharded as [%d:%d] by one step and [%d:%d] by another; "+
				"train it in steps that minimize the same variables", v.name, w.shard.lo, w.shard.lo+w.shard.n, sh.lo, sh.lo+sh.n)
		}
		return w, nil
	}
	w := &shardView{v: v, shard: sh}
	s := e.namespace("shard/" + v.name)
	for r, dev := range e.cfg.Devices {
		w.scratch = append(w.scratch, op.VarHandleOp(s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(dev), v.dtype,
			tf.MakeShape(sh.n), op.VarHandleOpSharedName(fmt.Sprintf("%s/shard/replica_%d", v.name, e.cfg.FirstReplicaID+r))))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	e.views[v] = w
	return w, nil
}

// shardedSlot returns the slot key names for the shard of w: a variable
// whose name and shape are the whole variable's, of which each local
// replica keeps w's shard, created with init and saved whole (aggregate
// gathers it).
func (e *Engine) shardedSlot(key slotKey, name string, w *shardView, init strategy.Initializer) (*variable, error) {
	if s, ok := e.slots[key]; ok {
		return s, nil
	}
	if _, dup := e.byName[name]; dup {
		return nil, fmt.Errorf("strategy: variable name %q: already used; names must be unique", name)
	}
	v := &variable{name: name, dtype: w.v.dtype, shape: w.v.Shape(), sync: strategy.OnWrite, agg: strategy.AggregationNone,
		owner: e, shard: &w.shard}
	s := e.namespace("var/" + name)
	var assigns []*tf.Operation
	for r, dev := range e.cfg.Devices {
		rs := s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(dev)
		val, err := init.Build(rs.SubScope("initial_value"), v.dtype, []int64{w.shard.n})
		if err != nil {
			return nil, fmt.Errorf("strategy: variable %q: %w", name, err)
		}
		h := op.VarHandleOp(rs, v.dtype, tf.MakeShape(w.shard.n),
			op.VarHandleOpSharedName(fmt.Sprintf("%s/replica_%d", name, e.cfg.FirstReplicaID+r)))
		v.handles = append(v.handles, h)
		assigns = append(assigns, op.AssignVariableOp(rs.SubScope("init"), h, val))
	}
	v.init = op.NoOp(s.SubScope("init").WithControlDependencies(assigns...))
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("strategy: variable %q: %w", name, err)
	}
	e.vars = append(e.vars, v)
	e.byName[name] = v
	e.slots[key] = v
	return v, nil
}

// shardedStep is a sharded step's update being built.
type shardedStep struct {
	e       *Engine
	s       *op.Scope
	buckets []bucket
	views   []*shardView  // per variable of the step
	grads   [][]tf.Output // per local replica, per variable: its shard's gradient
}

// mergeApplySharded is mergeApply under Sharding: the gradients of vars,
// vals[r][i], are reduce-scattered bucket by bucket, each local replica
// updates its working copies of this worker's shards, and the updated
// shards of replica 0 are all-gathered into every local copy of the
// variables, after that replica's reads of them, reads[r].
func (e *Engine) mergeApplySharded(opt strategy.Optimizer, vars []*variable, vals [][]tf.Output, reads [][]*tf.Operation, ab *accumBuild) ([]any, error) {
	if e.cfg.GradientReducer != nil {
		return nil, fmt.Errorf("sharded optimizer state reduce-scatters the gradients as they are; the strategy's %T cannot", e.cfg.GradientReducer)
	}
	buckets, err := e.planShards(vars, vals[0])
	if err != nil {
		return nil, err
	}
	st := &shardedStep{e: e, s: e.namespace("apply_gradients"), buckets: buckets, views: make([]*shardView, len(vars)),
		grads: make([][]tf.Output, len(vals))}
	for r := range st.grads {
		st.grads[r] = make([]tf.Output, len(vars))
	}
	for _, b := range buckets {
		for x, i := range b.idx {
			if st.views[i], err = e.view(vars[i], b.shards[x]); err != nil {
				return nil, err
			}
		}
	}
	in, err := st.toScatter(ab, vars, vals)
	if err != nil {
		return nil, err
	}
	for j := range buckets {
		if err := st.reduceScatter(j, in); err != nil {
			return nil, err
		}
	}
	if ab.accumulates() {
		if err := st.average(ab); err != nil {
			return nil, err
		}
	}
	applied := make([]*tf.Operation, len(vals))
	for r := range vals {
		if applied[r], err = st.apply(opt, r); err != nil {
			return nil, err
		}
	}
	assigns := make([][]*tf.Operation, len(vals))
	for j := range buckets {
		if err := st.allGather(j, vars, reads, applied, assigns); err != nil {
			return nil, err
		}
	}
	out := make([]any, len(vals))
	for r := range vals {
		out[r] = op.NoOp(st.s.SubScope(fmt.Sprintf("done_%d", r)).WithControlDependencies(append(assigns[r], applied[r])...))
	}
	return out, st.s.Err()
}

// toScatter returns what the step reduce-scatters, per local replica and
// variable: the gradients vals; in a step that accumulates, at stage 1 the
// sums of the whole accumulators and vals, at stage 2 vals alone, both
// times the run's loss divisor.
func (st *shardedStep) toScatter(ab *accumBuild, vars []*variable, vals [][]tf.Output) ([][]tf.Output, error) {
	e := st.e
	switch {
	case !ab.accumulates():
		return vals, nil
	case e.cfg.Sharding.Stage() == 1:
		accs := make([]*variable, len(vars))
		for i, v := range vars {
			a, err := e.accumulator(ab, slotKey{owner: accumOwner, v: v, slot: accumGradient}, accumulatorName(v), v.dtype, v.shape)
			if err != nil {
				return nil, err
			}
			accs[i] = a
		}
		return e.accumulatedTotals(st.s.SubScope("accumulate"), ab, accs, vals), nil
	}
	if _, err := e.accumulation(ab.k); err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(vals))
	for r := range vals {
		rs := st.s.SubScope(fmt.Sprintf("scale_%d", r)).WithDevice(e.cfg.Devices[r])
		for i, g := range vals[r] {
			out[r] = append(out[r], e.scaled(rs.SubScope(fmt.Sprintf("value_%d", i)), ab, r, g))
		}
	}
	return out, nil
}

// accumulatorName is the name of the accumulator of v's gradient.
func accumulatorName(v *variable) string { return v.name + "/" + accumOwner + "/" + accumGradient }

// average divides the reduced sums of a step that accumulates by the
// examples of every replica; at stage 2 it first adds the sums of the
// earlier micro-steps, which this worker's shard accumulators keep, and a
// micro-step that only accumulates adds its reduced block to them.
func (st *shardedStep) average(ab *accumBuild) error {
	e := st.e
	hs := st.s.SubScope("examples").WithDevice(e.cfg.HostDevice)
	counts := make([]tf.Output, len(e.cfg.Devices))
	for r := range counts {
		counts[r] = e.accumulatedCount(ab, r)
	}
	count, err := e.cfg.Sharding.SumAcross(hs.SubScope("across"), op.AddN(hs.SubScope("local"), counts))
	if err != nil {
		return err
	}
	for i, w := range st.views {
		var acc *variable
		if e.cfg.Sharding.Stage() == 2 {
			if acc, err = st.shardAccumulator(ab, w); err != nil {
				return err
			}
		}
		for r := range st.grads {
			rs := st.s.SubScope(fmt.Sprintf("average_%d_replica_%d", i, r)).WithDevice(e.cfg.Devices[r])
			sum := st.grads[r][i]
			if acc != nil {
				ab.micro = append(ab.micro, op.AssignAddVariableOp(rs.SubScope("add"), acc.handles[r], sum))
				sum = op.AddV2(rs.SubScope("total"), op.ReadVariableOp(rs.SubScope("read"), acc.handles[r], acc.dtype), sum)
			}
			st.grads[r][i] = op.DivNoNan(rs, sum, graphutil.CastTo(rs.SubScope("count"), count, w.v.dtype))
		}
	}
	return st.s.Err()
}

// shardAccumulator returns the stage-2 accumulator of w's shard of the
// reduced gradient, which the applying run zeroes. Saved whole, it holds
// what an unsharded accumulator holds, the sum over every replica.
func (st *shardedStep) shardAccumulator(ab *accumBuild, w *shardView) (*variable, error) {
	a, err := st.e.shardedSlot(slotKey{owner: accumOwner, v: w.v, slot: accumGradient}, accumulatorName(w.v), w, strategy.Zeros())
	if err != nil {
		return nil, err
	}
	for _, b := range ab.accs {
		if b == a {
			return nil, fmt.Errorf("accumulator %q is used twice in one step: give each variable to one Minimize", a.name)
		}
	}
	ab.accs = append(ab.accs, a)
	return a, nil
}

// reduceScatter reduce-scatters bucket j of every replica's gradients
// vals and slices each variable's shard of the block for every replica.
func (st *shardedStep) reduceScatter(j int, vals [][]tf.Output) error {
	e, b := st.e, st.buckets[j]
	bs := st.s.SubScope(fmt.Sprintf("reduce_scatter_%d", j))
	parts := make([]tf.Output, len(vals))
	for r := range vals {
		rs := bs.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r])
		flat := make([]tf.Output, len(b.idx))
		for x, i := range b.idx {
			flat[x] = op.Reshape(rs.SubScope(fmt.Sprintf("flat_%d", x)), vals[r][i], op.Const(rs.SubScope(fmt.Sprintf("minus_one_%d", x)), []int32{-1}))
		}
		parts[r] = flat[0]
		if len(flat) > 1 {
			parts[r] = op.ConcatV2(rs.SubScope("concat"), flat, op.Const(rs.SubScope("axis"), int32(0)))
		}
	}
	block, err := e.cfg.Sharding.ReduceScatter(bs.SubScope("engine"), parts, e.cfg.Devices)
	if err != nil {
		return err
	}
	for x, i := range b.idx {
		off := int64(0)
		if b.shards[x].n > 0 {
			off = sum(b.sizes[:x]) + b.shards[x].lo - b.block.lo
		}
		for r, dev := range e.cfg.Devices {
			rs := bs.SubScope(fmt.Sprintf("shard_%d_replica_%d", x, r)).WithDevice(dev)
			st.grads[r][i] = op.Slice(rs, block, op.Const(rs.SubScope("begin"), []int64{off}), op.Const(rs.SubScope("size"), []int64{b.shards[x].n}))
		}
	}
	return bs.Err()
}

// sum returns the sum of xs.
func sum(xs []int64) int64 {
	var t int64
	for _, x := range xs {
		t += x
	}
	return t
}

// apply fills replica r's working copies of the shards from its copies of
// the variables and has opt update them.
func (st *shardedStep) apply(opt strategy.Optimizer, r int) (*tf.Operation, error) {
	e := st.e
	rs := st.s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r])
	fill := make([]*tf.Operation, len(st.views))
	vars := make([]strategy.Variable, len(st.views))
	for i, w := range st.views {
		fs := rs.SubScope(fmt.Sprintf("fill_%d", i))
		flat := op.Reshape(fs.SubScope("flat"), op.ReadVariableOp(fs.SubScope("read"), w.v.handles[r], w.v.dtype), op.Const(fs.SubScope("minus_one"), []int32{-1}))
		part := op.Slice(fs, flat, op.Const(fs.SubScope("begin"), []int64{w.shard.lo}), op.Const(fs.SubScope("size"), []int64{w.shard.n}))
		fill[i] = op.AssignVariableOp(fs.SubScope("assign"), w.scratch[r], part)
		vars[i] = w
	}
	ac := &applyContext{e: e, scope: rs.SubScope("update").WithControlDependencies(fill...), replica: r}
	o, err := opt.Apply(shardContext{ac}, st.grads[r], vars)
	if err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
	// The update runs after the fills, and so after their reads of the
	// variables, which the all-gather then overwrites.
	return op.NoOp(rs.SubScope("applied").WithControlDependencies(append(fill, o)...)), rs.Err()
}

// allGather gathers bucket j's updated shards, replica 0's, into every
// local copy of its variables, after replica r's reads of them and its
// update; the assigns of replica r go to assigns[r].
func (st *shardedStep) allGather(j int, vars []*variable, reads [][]*tf.Operation, applied []*tf.Operation, assigns [][]*tf.Operation) error {
	e, b := st.e, st.buckets[j]
	gs := st.s.SubScope(fmt.Sprintf("all_gather_%d", j))
	rs := gs.SubScope("read").WithDevice(e.cfg.Devices[0]).WithControlDependencies(applied[0])
	parts := make([]tf.Output, len(b.idx))
	for x, i := range b.idx {
		parts[x] = op.ReadVariableOp(rs.SubScope(fmt.Sprintf("shard_%d", x)), st.views[i].scratch[0], vars[i].dtype)
	}
	block := parts[0]
	if len(parts) > 1 {
		block = op.ConcatV2(rs.SubScope("concat"), parts, op.Const(rs.SubScope("axis"), int32(0)))
	}
	whole, err := e.cfg.Sharding.AllGatherBlocks(gs.SubScope("engine"), block, b.elems)
	if err != nil {
		return err
	}
	split := []tf.Output{whole}
	if len(b.idx) > 1 {
		split = op.SplitV(gs.SubScope("split"), whole, op.Const(gs.SubScope("sizes"), b.sizes), op.Const(gs.SubScope("axis"), int32(0)), int64(len(b.sizes)))
	}
	for x, i := range b.idx {
		v := vars[i]
		for r, dev := range e.cfg.Devices {
			as := gs.SubScope(fmt.Sprintf("assign_%d_replica_%d", x, r)).WithDevice(dev).WithControlDependencies(append(slices.Clone(reads[r]), applied[r])...)
			val := op.Reshape(as.SubScope("shape"), split[x], op.Const(as.SubScope("dims"), v.shape))
			assigns[r] = append(assigns[r], op.AssignVariableOp(as, v.handles[r], val))
		}
	}
	return gs.Err()
}

// shardContext is the ApplyContext of a sharded update
// (strategy.ShardedApply): the optimizer is given shard views, whose
// handles are their working copies and whose slots are sharded.
type shardContext struct{ *applyContext }

var _ strategy.ShardedApply = shardContext{}

// Handle returns the replica's working copy of a shard view, or the
// replica's copy of any other variable (a step count).
func (sc shardContext) Handle(v strategy.Variable) tf.Output {
	if w, ok := v.(*shardView); ok {
		return w.scratch[sc.replica]
	}
	return sc.applyContext.Handle(v)
}

// Slot returns the sharded slot of a shard view, named after the whole
// variable.
func (sc shardContext) Slot(owner string, vv strategy.Variable, slot string, init strategy.Initializer) (strategy.Variable, error) {
	w, ok := vv.(*shardView)
	if !ok {
		return sc.applyContext.Slot(owner, vv, slot, init)
	}
	return sc.e.shardedSlot(slotKey{owner: owner, v: w.v, slot: slot}, fmt.Sprintf("%s/%s/%s", w.v.name, owner, slot), w, init)
}

// SumShards implements strategy.ShardedApply.
func (sc shardContext) SumShards(s *op.Scope, x tf.Output) (tf.Output, error) {
	sum, err := sc.e.cfg.Sharding.SumAcross(s.SubScope("sum_shards").WithDevice(sc.e.cfg.HostDevice), x)
	if err != nil {
		return tf.Output{}, err
	}
	return op.Identity(s.SubScope("summed"), sum), nil
}

// Whole implements strategy.ShardedApply.
func (sc shardContext) Whole(v strategy.Variable) (shape []int64, lo int64) {
	if w, ok := v.(*shardView); ok {
		return w.v.Shape(), w.shard.lo
	}
	return v.Shape(), 0
}

// gatherShards builds the whole value of the sharded slot v from every
// worker's shard, replica 0's.
func (e *Engine) gatherShards(s *op.Scope, v *variable) (tf.Output, error) {
	part := op.ReadVariableOp(s.SubScope("read").WithDevice(e.cfg.Devices[0]), v.handles[0], v.dtype)
	flat, err := e.cfg.Sharding.Gather(s.SubScope("gather"), part)
	if err != nil {
		return tf.Output{}, fmt.Errorf("variable %q: %w", v.name, err)
	}
	return op.Reshape(s.SubScope("whole").WithDevice(e.cfg.HostDevice), flat, op.Const(s.SubScope("shape"), v.shape)), nil
}

// writeShards assigns each local copy of the sharded slot v its shard of
// value, the whole slot.
func (e *Engine) writeShards(s *op.Scope, v *variable, value tf.Output) []*tf.Operation {
	hs := s.SubScope("shard").WithDevice(e.cfg.HostDevice)
	flat := op.Reshape(hs.SubScope("flat"), value, op.Const(hs.SubScope("minus_one"), []int32{-1}))
	part := op.Slice(hs, flat, op.Const(hs.SubScope("begin"), []int64{v.shard.lo}), op.Const(hs.SubScope("size"), []int64{v.shard.n}))
	ops := make([]*tf.Operation, len(v.handles))
	for r, h := range v.handles {
		ops[r] = op.AssignVariableOp(s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]), h, part)
	}
	return ops
}
