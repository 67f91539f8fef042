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

// of returns sh's part of x, a value of the whole variable.
func (sh shard) of(s *op.Scope, x tf.Output) tf.Output {
	flat := op.Reshape(s.SubScope("flat"), x, op.Const(s.SubScope("minus_one"), []int32{-1}))
	return op.Slice(s, flat, op.Const(s.SubScope("begin"), []int64{sh.lo}), op.Const(s.SubScope("size"), []int64{sh.n}))
}

// bucket is one bucket of a sharded step: the step's variables idx, of
// sizes elements, packed in that order, and this worker's block of it.
type bucket struct {
	idx    []int
	sizes  []int64
	elems  int64
	block  shard
	shards []shard // per variable of idx, its part of block
	within []int64 // per variable of idx, where its part starts in block
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
			within := lo - b.block.lo
			if hi < lo {
				lo, hi, within = at, at, 0
			}
			b.shards = append(b.shards, shard{lo: lo - at, n: hi - lo})
			b.within = append(b.within, within)
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
// take the whole variable's names), kept in a working copy on the first
// local device that each step fills from the variable.
type shardView struct {
	v       *variable
	shard   shard
	scratch tf.Output
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
	s := e.namespace("shard/" + v.name).WithDevice(e.cfg.Devices[0])
	w.scratch = op.VarHandleOp(s, v.dtype, tf.MakeShape(sh.n), op.VarHandleOpSharedName(fmt.Sprintf("%s/shard/replica_%d", v.name, e.cfg.FirstReplicaID)))
	if err := s.Err(); err != nil {
		return nil, err
	}
	e.views[v] = w
	return w, nil
}

// shardedSlot returns the slot key names for the shard of w: a variable
// whose name and shape are the whole variable's, of which this worker
// keeps w's shard in one copy on the first local device, which every local
// replica's handle names; it is created with init and saved whole
// (aggregate gathers it).
func (e *Engine) shardedSlot(key slotKey, name string, w *shardView, init strategy.Initializer) (*variable, error) {
	if s, ok := e.slots[key]; ok {
		return s, nil
	}
	if err := e.nameFree(name); err != nil {
		return nil, err
	}
	v := &variable{name: name, dtype: w.v.dtype, shape: w.v.Shape(), sync: strategy.OnWrite, agg: strategy.AggregationNone,
		owner: e, shard: &w.shard}
	s := e.namespace("var/" + name).WithDevice(e.cfg.Devices[0])
	val, err := init.Build(s.SubScope("initial_value"), v.dtype, []int64{w.shard.n})
	if err != nil {
		return nil, fmt.Errorf("strategy: variable %q: %w", name, err)
	}
	h := op.VarHandleOp(s, v.dtype, tf.MakeShape(w.shard.n), op.VarHandleOpSharedName(fmt.Sprintf("%s/replica_%d", name, e.cfg.FirstReplicaID)))
	for range e.cfg.Devices {
		v.handles = append(v.handles, h)
	}
	v.init = op.AssignVariableOp(s.SubScope("init"), h, val)
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("strategy: variable %q: %w", name, err)
	}
	e.add(v)
	e.slots[key] = v
	return v, nil
}

// shardedStep is a sharded step's update being built. One update serves
// the local replicas: the first's device updates the working copies, and
// the all-gathers write every replica's copies of the variables.
type shardedStep struct {
	e       *Engine
	s       *op.Scope
	buckets []bucket
	views   []*shardView      // per variable of the step
	grads   []tf.Output       // per variable: its shard's gradient, on the first device
	fills   []*tf.Operation   // per variable: the fill of its working copy
	updates [][]*tf.Operation // per variable: the ops of the update that use its working copy
}

// mergeApplySharded is mergeApply under Sharding: the gradients of vars,
// vals[r][i], are reduce-scattered bucket by bucket, the working copies of
// this worker's shards are updated once, and each bucket's updated shards
// are all-gathered into every local copy of its variables, as soon as
// their updates are done and after replica r's reads of them, reads[r].
func (e *Engine) mergeApplySharded(opt strategy.Optimizer, vars []*variable, vals [][]tf.Output, reads [][]*tf.Operation, ab *accumBuild) ([]any, error) {
	if e.cfg.GradientReducer != nil {
		return nil, fmt.Errorf("sharded optimizer state reduce-scatters the gradients as they are; the strategy's %T cannot", e.cfg.GradientReducer)
	}
	buckets, err := e.planShards(vars, vals[0])
	if err != nil {
		return nil, err
	}
	st := &shardedStep{e: e, s: e.namespace("apply_gradients"), buckets: buckets, views: make([]*shardView, len(vars)),
		grads: make([]tf.Output, len(vars))}
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
	applied, err := st.apply(opt)
	if err != nil {
		return nil, err
	}
	if _, ok := opt.(strategy.LossScaler); ok {
		// A skipped step's updates are dead: the all-gathers wait for the
		// whole update, which never is.
		for i := range st.updates {
			st.updates[i] = []*tf.Operation{applied}
		}
	}
	assigns := make([][]*tf.Operation, len(vals))
	for j := range buckets {
		if err := st.allGather(j, vars, reads, assigns); err != nil {
			return nil, err
		}
	}
	out := make([]any, len(vals))
	for r := range vals {
		out[r] = op.NoOp(st.s.SubScope(fmt.Sprintf("done_%d", r)).WithControlDependencies(append(assigns[r], applied)...))
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
		accs, err := e.gradientAccumulators(ab, vars)
		if err != nil {
			return nil, err
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
		rs := st.s.SubScope(fmt.Sprintf("average_%d", i)).WithDevice(e.cfg.Devices[0])
		sum := st.grads[i]
		if e.cfg.Sharding.Stage() == 2 {
			acc, err := st.shardAccumulator(ab, w)
			if err != nil {
				return err
			}
			ab.micro = append(ab.micro, op.AssignAddVariableOp(rs.SubScope("add"), acc.handles[0], sum))
			sum = op.AddV2(rs.SubScope("total"), op.ReadVariableOp(rs.SubScope("read"), acc.handles[0], acc.dtype), sum)
		}
		st.grads[i] = op.DivNoNan(rs, sum, graphutil.CastTo(rs.SubScope("count"), count, w.v.dtype))
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
// vals and slices each variable's shard of the block.
func (st *shardedStep) reduceScatter(j int, vals [][]tf.Output) error {
	e, b := st.e, st.buckets[j]
	bs := st.s.SubScope(fmt.Sprintf("reduce_scatter_%d", j))
	parts := make([]tf.Output, len(vals))
	for r := range vals {
		parts[r] = flatConcat(bs.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]), vals[r], b.idx)
	}
	block, err := e.cfg.Sharding.ReduceScatter(bs.SubScope("engine"), parts, e.cfg.Devices)
	if err != nil {
		return err
	}
	for x, i := range b.idx {
		rs := bs.SubScope(fmt.Sprintf("shard_%d", x)).WithDevice(e.cfg.Devices[0])
		st.grads[i] = op.Slice(rs, block, op.Const(rs.SubScope("begin"), []int64{b.within[x]}), op.Const(rs.SubScope("size"), []int64{b.shards[x].n}))
	}
	return bs.Err()
}

// apply fills the working copies of the shards from the first replica's
// copies of the variables and has opt update them, recording each
// variable's update ops (the new users of its working copy); the other
// replicas' copies of the optimizer's other variables (its step count)
// then take the first's. The op it returns runs it all.
func (st *shardedStep) apply(opt strategy.Optimizer) (*tf.Operation, error) {
	e := st.e
	rs := st.s.SubScope("update").WithDevice(e.cfg.Devices[0])
	st.fills = make([]*tf.Operation, len(st.views))
	vars := make([]strategy.Variable, len(st.views))
	before := make([]map[*tf.Operation]bool, len(st.views))
	for i, w := range st.views {
		fs := rs.SubScope(fmt.Sprintf("fill_%d", i))
		part := w.shard.of(fs, op.ReadVariableOp(fs.SubScope("read"), w.v.handles[0], w.v.dtype))
		st.fills[i] = op.AssignVariableOp(fs.SubScope("assign"), w.scratch, part)
		vars[i], before[i] = w, users(w.scratch, nil)
	}
	sc := &shardContext{applyContext: &applyContext{e: e, scope: rs.SubScope("apply").WithControlDependencies(st.fills...)}}
	o, err := opt.Apply(sc, st.grads, vars)
	if err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
	st.updates = make([][]*tf.Operation, len(st.views))
	for i, w := range st.views {
		for u := range users(w.scratch, before[i]) {
			st.updates[i] = append(st.updates[i], u)
		}
	}
	done := append([]*tf.Operation{o}, st.fills...)
	for k, v := range sc.nonSlots {
		ss := rs.SubScope(fmt.Sprintf("mirror_%d", k)).WithControlDependencies(o)
		for r, h := range v.handles[1:] {
			val := op.ReadVariableOp(ss.SubScope(fmt.Sprintf("read_%d", r)), v.handles[0], v.dtype)
			done = append(done, op.AssignVariableOp(ss.SubScope(fmt.Sprintf("replica_%d", r+1)).WithDevice(e.cfg.Devices[r+1]), h, val))
		}
	}
	return op.NoOp(rs.SubScope("applied").WithControlDependencies(done...)), rs.Err()
}

// users returns the ops that take h as an input, leaving out those of
// skip.
func users(h tf.Output, skip map[*tf.Operation]bool) map[*tf.Operation]bool {
	out := map[*tf.Operation]bool{}
	for _, c := range h.Consumers() {
		if !skip[c.Op] {
			out[c.Op] = true
		}
	}
	return out
}

// allGather gathers bucket j's updated shards into every local copy of its
// variables once their updates are done, each copy r after replica r's
// reads of it; the assigns of replica r go to assigns[r].
func (st *shardedStep) allGather(j int, vars []*variable, reads [][]*tf.Operation, assigns [][]*tf.Operation) error {
	e, b := st.e, st.buckets[j]
	gs := st.s.SubScope(fmt.Sprintf("all_gather_%d", j))
	var deps []*tf.Operation
	for _, i := range b.idx {
		deps = append(append(deps, st.fills[i]), st.updates[i]...)
	}
	rs := gs.SubScope("read").WithDevice(e.cfg.Devices[0]).WithControlDependencies(deps...)
	parts := make([]tf.Output, len(b.idx))
	for x, i := range b.idx {
		parts[x] = op.ReadVariableOp(rs.SubScope(fmt.Sprintf("shard_%d", x)), st.views[i].scratch, vars[i].dtype)
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
			as := gs.SubScope(fmt.Sprintf("assign_%d_replica_%d", x, r)).WithDevice(dev).WithControlDependencies(reads[r]...)
			val := op.Reshape(as.SubScope("shape"), split[x], op.Const(as.SubScope("dims"), v.shape))
			assigns[r] = append(assigns[r], op.AssignVariableOp(as, v.handles[r], val))
		}
	}
	return gs.Err()
}

// shardContext is the ApplyContext of a sharded update
// (strategy.ShardedApply): the optimizer is given shard views, whose
// handles are their working copies and whose slots are sharded. It
// records the optimizer's other variables (NonSlot), whose first copy it
// updates.
type shardContext struct {
	*applyContext
	nonSlots []*variable
}

var _ strategy.ShardedApply = (*shardContext)(nil)

// Handle returns the working copy of a shard view, or the first replica's
// copy of any other variable (a step count).
func (sc *shardContext) Handle(v strategy.Variable) tf.Output {
	if w, ok := v.(*shardView); ok {
		return w.scratch
	}
	return sc.applyContext.Handle(v)
}

// Slot returns the sharded slot of a shard view, named after the whole
// variable.
func (sc *shardContext) Slot(owner string, vv strategy.Variable, slot string, init strategy.Initializer) (strategy.Variable, error) {
	w, ok := vv.(*shardView)
	if !ok {
		return sc.applyContext.Slot(owner, vv, slot, init)
	}
	return sc.e.shardedSlot(slotKey{owner: owner, v: w.v, slot: slot}, fmt.Sprintf("%s/%s/%s", w.v.name, owner, slot), w, init)
}

// NonSlot returns the optimizer's variable as applyContext does, and
// records it.
func (sc *shardContext) NonSlot(owner, name string, dtype tf.DataType, shape []int64, init strategy.Initializer) (strategy.Variable, error) {
	v, err := sc.applyContext.NonSlot(owner, name, dtype, shape, init)
	if err == nil && !slices.Contains(sc.nonSlots, v.(*variable)) {
		sc.nonSlots = append(sc.nonSlots, v.(*variable))
	}
	return v, err
}

// SumShards implements strategy.ShardedApply.
func (sc *shardContext) SumShards(s *op.Scope, x tf.Output) (tf.Output, error) {
	sum, err := sc.e.cfg.Sharding.SumAcross(s.SubScope("sum_shards").WithDevice(sc.e.cfg.HostDevice), x)
	if err != nil {
		return tf.Output{}, err
	}
	return op.Identity(s.SubScope("summed"), sum), nil
}

// Whole implements strategy.ShardedApply.
func (sc *shardContext) Whole(v strategy.Variable) (shape []int64, lo int64) {
	if w, ok := v.(*shardView); ok {
		return w.v.Shape(), w.shard.lo
	}
	return v.Shape(), 0
}

// WholeValue implements strategy.ShardedApply.
func (sc *shardContext) WholeValue(s *op.Scope, v strategy.Variable) tf.Output {
	if w, ok := v.(*shardView); ok {
		return op.ReadVariableOp(s, w.v.handles[0], w.v.dtype)
	}
	return op.ReadVariableOp(s, sc.Handle(v), v.DType())
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

// writeShards assigns the sharded slot v its shard of value, the whole
// slot.
func (e *Engine) writeShards(s *op.Scope, v *variable, value tf.Output) []*tf.Operation {
	part := v.shard.of(s.SubScope("shard").WithDevice(e.cfg.HostDevice), value)
	return []*tf.Operation{op.AssignVariableOp(s.SubScope("assign").WithDevice(e.cfg.Devices[0]), v.handles[0], part)}
}
