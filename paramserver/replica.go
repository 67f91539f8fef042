package paramserver

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// replicaContext is the strategy's strategy.Replica, what a step function
// sees while Build traces it for one worker: a scope pinned to the worker,
// the variables (read whole or looked up by rows), and Minimize, which
// applies the step's gradients to the variables on the ps tasks —
// asynchronously: each worker's step updates the variables as soon as it
// has its gradients, with no all-reduce.
type replicaContext struct {
	s       *Strategy
	w       *workerGraph
	ns      string
	root    *op.Scope // the function's namespace, no device
	scope   *op.Scope // the function's namespace on the worker
	batch   tf.Output
	reads   map[*Variable]*denseRead
	lookups map[*Variable][]*lookup
	guard   *guard
	applies []*tf.Operation
	targets []*tf.Operation
	nGrad   int
	reduced strategy.ReducedOutputs
}

var _ strategy.Replica = (*replicaContext)(nil)

// errNotInSync is returned by the cross-replica calls.
var errNotInSync = errors.New("the parameter-server strategy has no cross-replica reductions: its workers run steps asynchronously")

type denseRead struct {
	out   tf.Output
	parts []tf.Output // one read per shard
}

type lookup struct {
	v        *Variable
	out      tf.Output
	flat     tf.Output   // the ids, checked and flattened (int64)
	p        tf.Output   // each id's shard (int32); unset for one shard
	ids      []tf.Output // each shard's local row ids
	rowShape []int64
}

// guard makes a step's update apply at most once however often the step is
// run: see Function.
type guard struct {
	cid  tf.Output // the closure id, fed
	pred tf.Output // true when this closure was not applied before
	upd  tf.Output // the increment of the progress counter
}

// ReplicaID returns the index of the worker this copy of the step runs on.
func (rc *replicaContext) ReplicaID() int { return rc.w.index }

// NumReplicasInSync returns 1: each worker applies its own update, as
// tf.distribute's ParameterServerStrategy counts one replica in sync per
// CPU worker.
func (rc *replicaContext) NumReplicasInSync() int { return 1 }

// Scope returns a graph scope pinned to the worker.
func (rc *replicaContext) Scope() *op.Scope { return rc.scope }

// AverageLoss returns the sum of every element of perExample divided by
// the examples of the worker's batch (the leading dimension of the step's
// first input, by name; 0 when it is 0), since each worker's step is
// applied on its own: the batch's mean when perExample holds one value
// per example, and for a per-token loss the tokens per example times the
// mean per token, which nn.ComputeAverageLoss of the flattened loss gives.
func (rc *replicaContext) AverageLoss(perExample tf.Output) tf.Output {
	return graphutil.AverageLoss(rc.scope.SubScope("average_loss"), perExample, rc.batch)
}

// AllReduce is an error: the workers do not run in sync.
func (rc *replicaContext) AllReduce(strategy.ReduceOp, tf.Output) (tf.Output, error) {
	return tf.Output{}, fmt.Errorf("AllReduce: %w", errNotInSync)
}

// AllGather is an error: the workers do not run in sync.
func (rc *replicaContext) AllGather(tf.Output) (tf.Output, error) {
	return tf.Output{}, fmt.Errorf("AllGather: %w", errNotInSync)
}

// ReduceOutput declares an output named name that the step returns with
// its other outputs. A worker's step is one replica, not in sync with the
// others, so the value combined across the replicas of the step is value
// itself, for Sum and Mean alike.
func (rc *replicaContext) ReduceOutput(name string, red strategy.ReduceOp, value tf.Output) error {
	return rc.reduced.Declare(name, red, value)
}

// AddTarget makes o run every time the step runs.
func (rc *replicaContext) AddTarget(o *tf.Operation) { rc.targets = append(rc.targets, o) }

func (rc *replicaContext) own(v strategy.Variable, what string) (*Variable, error) {
	return rc.s.own(v, what)
}

// Read returns the whole value of v as this step sees it: each shard read
// on its ps task, concatenated on the worker. Within one step every Read of
// v gives the same tensor.
func (rc *replicaContext) Read(vv strategy.Variable) (tf.Output, error) {
	v, err := rc.own(vv, "Read")
	if err != nil {
		return tf.Output{}, err
	}
	if r, ok := rc.reads[v]; ok {
		return r.out, nil
	}
	s := rc.scope.SubScope("read_" + sanitize(v.name))
	r := &denseRead{}
	err = graphutil.Safely(func() error {
		for k, sh := range v.shards {
			r.parts = append(r.parts, op.ReadVariableOp(s.SubScope(fmt.Sprintf("part_%d", k)).WithDevice(sh.device), rc.w.handle(sh), v.dtype))
		}
		r.out = r.parts[0]
		if len(r.parts) > 1 {
			r.out = op.ConcatV2(s.SubScope("concat"), r.parts, op.Const(s.SubScope("axis"), int32(0)))
		}
		return s.Err()
	})
	if err != nil {
		return tf.Output{}, fmt.Errorf("Read %q: %w", v.name, err)
	}
	rc.reads[v] = r
	return r.out, nil
}

// Lookup returns the rows of v that ids (int32 or int64, any shape) name:
// an embedding lookup, shape ids.shape + v.shape[1:]. Each id is sent to the
// shard that holds its row and gathered there, on the ps task; only the
// rows looked up cross the network. Minimize then updates only those rows,
// on their shards (WithSparseOptimizer). An id outside [0, rows) fails the
// step with an error that names it.
func (rc *replicaContext) Lookup(vv strategy.Variable, ids tf.Output) (tf.Output, error) {
	v, err := rc.own(vv, "Lookup")
	if err != nil {
		return tf.Output{}, err
	}
	if err := graphutil.CheckLookup(v.name, v.shape, ids); err != nil {
		return tf.Output{}, err
	}
	s := rc.scope.SubScope("lookup_" + sanitize(v.name))
	l := &lookup{v: v, rowShape: v.shape[1:]}
	err = graphutil.Safely(func() error {
		// Check the ids on the worker, so that a bad one fails the step
		// with its value rather than with a shard's index.
		flat := graphutil.CheckedIDs(s.SubScope("ids"), v.name, v.shape[0], ids)
		l.flat = flat
		var rows tf.Output
		if len(v.shards) == 1 {
			sh := v.shards[0]
			rows = op.ResourceGather(s.SubScope("gather").WithDevice(sh.device), rc.w.handle(sh), flat, v.dtype)
			l.ids = []tf.Output{flat}
		} else {
			k := int64(len(v.shards))
			q, r := v.shape[0]/k, v.shape[0]%k
			thr := r * (q + 1)
			c := func(name string, x int64) tf.Output { return op.Const(s.SubScope(name), x) }
			big := op.FloorDiv(s.SubScope("p_big"), flat, c("big", q+1))
			small := op.Add(s.SubScope("p_small"), c("r", r), op.FloorDiv(s.SubScope("div_small"),
				op.Sub(s.SubScope("minus_thr"), flat, c("thr", thr)), c("q", q)))
			p := op.Select(s.SubScope("p"), op.Less(s.SubScope("in_big"), flat, c("thr2", thr)), big, small)
			offsets := make([]int64, k)
			for i, sh := range v.shards {
				offsets[i] = sh.offset
			}
			local := op.Sub(s.SubScope("local"), flat, op.GatherV2(s.SubScope("offset"), op.Const(s.SubScope("offsets"), offsets), p,
				op.Const(s.SubScope("axis"), int32(0))))
			l.p = op.Cast(s.SubScope("p32"), p, tf.Int32)
			l.ids = op.DynamicPartition(s.SubScope("ids"), local, l.p, k)
			n := op.Size(s.SubScope("n"), flat, op.SizeOutType(tf.Int32))
			pos := op.DynamicPartition(s.SubScope("positions"), op.Range(s.SubScope("range"), op.Const(s.SubScope("zero"), int32(0)), n,
				op.Const(s.SubScope("one"), int32(1))), l.p, k)
			parts := make([]tf.Output, k)
			for i, sh := range v.shards {
				parts[i] = op.ResourceGather(s.SubScope(fmt.Sprintf("gather_%d", i)).WithDevice(sh.device), rc.w.handle(sh), l.ids[i], v.dtype)
			}
			rows = op.DynamicStitch(s.SubScope("stitch"), pos, parts)
		}
		l.out = op.Reshape(s.SubScope("out"), rows, graphutil.RowsShape(s.SubScope("shape"), ids, l.rowShape))
		return s.Err()
	})
	if err != nil {
		return tf.Output{}, graphutil.WrapLookup(v.name, err)
	}
	rc.lookups[v] = append(rc.lookups[v], l)
	return l.out, nil
}

// Minimize computes the gradients of loss with respect to vars and applies
// them on the ps tasks. A variable the step reads (Read) gets a dense update
// from opt, an optimizer of package optimizer, with its slots on the
// variable's ps task. A variable the step looks up (Lookup) gets, with the
// WithSparseOptimizer option, a sparse update of the rows looked up; without
// it, opt's dense update of its shards from the looked-up rows' gradients,
// zero for every other row, as a Keras optimizer updates an embedding under
// tf.distribute (only the looked-up rows' gradients cross the network, but
// the update, and opt's slots, cover every row). loss should be this step's
// mean loss (AverageLoss): each worker's step is applied on its own, as soon
// as it is computed.
//
// The update is guarded: a step run again after its worker died applies it
// only if the first run did not (see Function).
func (rc *replicaContext) Minimize(opt strategy.Optimizer, loss tf.Output, vs []strategy.Variable, opts ...strategy.MinimizeOption) error {
	mc, err := strategy.NewMinimizeConfig(opts...)
	if err != nil {
		return fmt.Errorf("Minimize: %w", err)
	}
	if mc.Accumulation > 1 {
		return fmt.Errorf("Minimize: WithAccumulation(%d): gradient accumulation is not supported under the parameter-server strategy, whose workers apply their steps asynchronously", mc.Accumulation)
	}
	vars, err := rc.trainable("Minimize", vs)
	if err != nil {
		return err
	}
	u, err := rc.plan(vars, mc.Sparse != nil)
	if err != nil {
		return err
	}
	if err := checkOptimizer(opt, len(u.dense)+len(u.densified) > 0); err != nil {
		return err
	}
	grads, err := rc.gradients("Minimize", loss, u.xs(), vars)
	if err != nil {
		return err
	}
	pred, err := rc.makeGuard(grads)
	if err != nil {
		return err
	}
	s := rc.root.SubScope("apply")
	n := len(u.reads)
	dense, denseGrads := u.dense, slices.Clone(grads[:n])
	for i, ls := range u.densified {
		shards, gs := rc.densify(s.SubScope(fmt.Sprintf("densify_%d", i)), ls, grads[n:n+len(ls)])
		dense, denseGrads = append(dense, shards...), append(denseGrads, gs...)
		n += len(ls)
	}
	if err := rc.applyDense(s, opt, dense, denseGrads, pred); err != nil {
		return err
	}
	if err := rc.applySparse(s, mc.Sparse, u.sparse, grads[n:], pred); err != nil {
		return err
	}
	return s.Err()
}

// trainable returns vs as this strategy's variables, each given once and
// trainable; what names the call in errors.
func (rc *replicaContext) trainable(what string, vs []strategy.Variable) ([]*Variable, error) {
	if len(vs) == 0 {
		return nil, fmt.Errorf("%s: no variables", what)
	}
	vars := make([]*Variable, len(vs))
	seen := map[*Variable]bool{}
	for i, vv := range vs {
		v, err := rc.own(vv, what)
		if err != nil {
			return nil, err
		}
		switch {
		case seen[v]:
			return nil, fmt.Errorf("%s: variable %q is given twice", what, v.name)
		case !v.trainable:
			return nil, fmt.Errorf("%s: variable %q is not trainable", what, v.name)
		}
		seen[v], vars[i] = true, v
	}
	return vars, nil
}

// update is how Minimize updates a step's variables.
type update struct {
	reads     []tf.Output // the read variables' shards, as the step read them
	dense     []*shard    // those shards, for opt
	densified [][]*lookup // each looked-up variable's lookups, for opt (no sparse optimizer)
	sparse    []*lookup   // the looked-up variables' lookups, for the sparse optimizer
}

// plan sorts vars by how the step used them: read, or looked up and
// updated sparsely when sparse is set.
func (rc *replicaContext) plan(vars []*Variable, sparse bool) (update, error) {
	var u update
	for _, v := range vars {
		r, ls, err := rc.uses("Minimize", v)
		switch {
		case err != nil:
			return u, err
		case r != nil:
			u.reads = append(u.reads, r.parts...)
			u.dense = append(u.dense, v.shards...)
		case sparse:
			u.sparse = append(u.sparse, ls...)
		default:
			u.densified = append(u.densified, ls)
		}
	}
	return u, nil
}

// uses returns how the step used v: its read, or else its lookups. A
// variable both read and looked up, or neither, is an error; what names
// the call.
func (rc *replicaContext) uses(what string, v *Variable) (*denseRead, []*lookup, error) {
	r, ls := rc.reads[v], rc.lookups[v]
	switch {
	case r != nil && len(ls) > 0:
		return nil, nil, fmt.Errorf("%s: the step both reads and looks up variable %q; use one or the other", what, v.name)
	case r == nil && len(ls) == 0:
		return nil, nil, fmt.Errorf("%s: the loss does not depend on variable %q: the step neither reads nor looks it up", what, v.name)
	}
	return r, ls, nil
}

// xs returns what Minimize differentiates the loss by: the read shards,
// then the densified lookups' rows, then the sparse ones'.
func (u update) xs() []tf.Output {
	xs := slices.Clone(u.reads)
	for _, ls := range append(slices.Clone(u.densified), u.sparse) {
		for _, l := range ls {
			xs = append(xs, l.out)
		}
	}
	return xs
}

// checkOptimizer refuses a missing dense optimizer and the ones this
// strategy cannot apply.
func checkOptimizer(opt strategy.Optimizer, needed bool) error {
	if needed && opt == nil {
		return errors.New("Minimize: nil optimizer")
	}
	if _, ok := opt.(strategy.PrivateOptimizer); ok {
		return fmt.Errorf("Minimize: optimizer %T is DP-SGD, which the parameter-server strategy does not support: its workers apply their updates asynchronously, each on its own batch, which the privacy accounting (one noisy sum per global step) does not cover; train with the default, mirrored or multiworker strategy", opt)
	}
	if _, ok := opt.(strategy.LossScaler); ok {
		return fmt.Errorf("Minimize: optimizer %T scales the loss, which the parameter-server strategy does not support: its workers update asynchronously, so no scale holds for a whole step (as in tf.distribute); train mixed precision with bfloat16, which needs no loss scaling", opt)
	}
	return nil
}

// rowParts returns the gradient g of lookup l's rows as [rows, row...],
// divided among the variable's shards as l's ids are.
func (rc *replicaContext) rowParts(s *op.Scope, l *lookup, g tf.Output) []tf.Output {
	rows := rc.rows(s, l, g)
	if len(l.v.shards) == 1 {
		return []tf.Output{rows}
	}
	return op.DynamicPartition(s.SubScope("partition").WithDevice(rc.w.device), rows, l.p, int64(len(l.v.shards)))
}

// rows returns g, the gradient of lookup l's result, as one row per id
// looked up: [ids, row...], on the worker.
func (rc *replicaContext) rows(s *op.Scope, l *lookup, g tf.Output) tf.Output {
	rowShape := append([]int32{-1}, make([]int32, len(l.rowShape))...)
	for i, d := range l.rowShape {
		rowShape[i+1] = int32(d)
	}
	ws := s.WithDevice(rc.w.device)
	return op.Reshape(ws.SubScope("rows"), g, op.Const(ws.SubScope("row_shape"), rowShape))
}

// densify returns the shards of the variable that lookups ls looked up,
// and each shard's dense gradient: the looked-up rows' gradients grads,
// summed into their rows on the shard's ps task, zero elsewhere.
func (rc *replicaContext) densify(s *op.Scope, ls []*lookup, grads []tf.Output) ([]*shard, []tf.Output) {
	v := ls[0].v
	sums := make([][]tf.Output, len(v.shards))
	for j, l := range ls {
		parts := rc.rowParts(s.SubScope(fmt.Sprintf("lookup_%d", j)), l, grads[j])
		for k, sh := range v.shards {
			ks := s.SubScope(fmt.Sprintf("lookup_%d_shard_%d", j, k)).WithDevice(sh.device)
			sums[k] = append(sums[k], op.UnsortedSegmentSum(ks, parts[k], l.ids[k], op.Const(ks.SubScope("rows"), sh.rows)))
		}
	}
	out := make([]tf.Output, len(v.shards))
	for k, sh := range v.shards {
		out[k] = sums[k][0]
		if len(sums[k]) > 1 {
			out[k] = op.AddN(s.SubScope(fmt.Sprintf("sum_%d", k)).WithDevice(sh.device), sums[k])
		}
	}
	return v.shards, out
}

// applyDense adds opt's update of shards by grads, each applied only if
// pred holds.
func (rc *replicaContext) applyDense(s *op.Scope, opt strategy.Optimizer, shards []*shard, grads []tf.Output, pred tf.Output) error {
	if len(shards) == 0 {
		return nil
	}
	views := make([]strategy.Variable, len(shards))
	switched := make([]tf.Output, len(shards))
	for i, sh := range shards {
		views[i] = sh
		_, switched[i] = op.Switch(s.SubScope(fmt.Sprintf("guard_%d", i)).WithDevice(sh.device), grads[i], pred)
	}
	ac := &applyContext{s: rc.s, scope: s.SubScope("dense"), handle: rc.w.handle}
	var up *tf.Operation
	if err := graphutil.Safely(func() (err error) { up, err = opt.Apply(ac, switched, views); return err }); err != nil {
		return fmt.Errorf("Minimize: optimizer: %w", err)
	}
	rc.applies = append(rc.applies, up)
	return nil
}

// applySparse adds sp's update of the rows each lookup looked up, on their
// shards, by grads, each applied only if pred holds.
func (rc *replicaContext) applySparse(s *op.Scope, sp strategy.SparseOptimizer, lookups []*lookup, grads []tf.Output, pred tf.Output) error {
	for j, l := range lookups {
		ss := s.SubScope(fmt.Sprintf("sparse_%d", j))
		parts := rc.rowParts(ss, l, grads[j])
		for k, sh := range l.v.shards {
			ks := ss.SubScope(fmt.Sprintf("shard_%d", k)).WithDevice(sh.device)
			_, ids := op.Switch(ks.SubScope("guard_ids"), l.ids[k], pred)
			_, vals := op.Switch(ks.SubScope("guard_values"), parts[k], pred)
			var up *tf.Operation
			if err := graphutil.Safely(func() (err error) {
				up, err = sp.ApplySparse(ks.SubScope("update"), rc.w.handle(sh), ids, vals, l.v.dtype)
				return err
			}); err != nil {
				return fmt.Errorf("Minimize: sparse optimizer: %w", err)
			}
			rc.applies = append(rc.applies, up)
		}
	}
	return nil
}

// gradients returns the gradients of loss with respect to xs, from
// TensorFlow's gradient registry; what names the call in errors.
func (rc *replicaContext) gradients(what string, loss tf.Output, xs []tf.Output, vars []*Variable) ([]tf.Output, error) {
	if err := rc.root.Err(); err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("%s/gradients_%d", rc.ns, rc.nGrad)
	rc.nGrad++
	grads, err := rc.w.graph.AddGradients(prefix, []tf.Output{loss}, xs, nil)
	if err != nil {
		if strings.Contains(err.Error(), "unreachable from the output") {
			return nil, fmt.Errorf("%s: gradients of %q: the loss does not depend on some of the variables %v", what, loss.Op.Name(), names(vars))
		}
		return nil, fmt.Errorf("%s: gradients of %q: %w", what, loss.Op.Name(), err)
	}
	for i, g := range grads {
		if g.Op == nil {
			return nil, fmt.Errorf("%s: gradients of %q: the loss does not depend on %q", what, loss.Op.Name(), xs[i].Op.Name())
		}
	}
	return grads, nil
}

func names(vars []*Variable) []string {
	out := make([]string, len(vars))
	for i, v := range vars {
		out[i] = v.name
	}
	return out
}

// makeGuard builds, on the first update of the step, the check that this
// closure's update was not applied before: it reads the progress counter on
// ps 0 once the gradients exist and compares the closure id with the last
// id every worker applied.
func (rc *replicaContext) makeGuard(grads []tf.Output) (tf.Output, error) {
	if rc.guard != nil {
		return rc.guard.pred, nil
	}
	g := &guard{}
	g.cid = op.Placeholder(rc.scope.SubScope("closure_id"), tf.Int64, op.PlaceholderShape(tf.ScalarShape()))
	ctrl := make([]*tf.Operation, len(grads))
	for i, gr := range grads {
		ctrl[i] = gr.Op
	}
	s := rc.root.SubScope("guard").WithDevice(rc.s.ps[0])
	n := int64(len(rc.s.workers))
	w := int64(rc.w.index)
	cur := op.ReadVariableOp(s.SubScope("progress").WithControlDependencies(ctrl...), rc.w.progress, tf.Int64)
	last := op.Slice(s.SubScope("last"), cur, op.Const(s.SubScope("last_begin"), []int64{1}), op.Const(s.SubScope("last_size"), []int64{n}))
	seen := op.Any(s.SubScope("seen"), op.Equal(s.SubScope("equal"), last, g.cid), op.Const(s.SubScope("axis"), int32(0)))
	g.pred = op.LogicalNot(s.SubScope("pred"), seen)
	prev := op.Slice(s.SubScope("prev"), cur, op.Const(s.SubScope("prev_begin"), []int64{1 + w}), op.Const(s.SubScope("prev_size"), []int64{1}))
	delta := op.Sub(s.SubScope("delta"), op.Reshape(s.SubScope("cid"), g.cid, op.Const(s.SubScope("cid_shape"), []int32{1})), prev)
	// The increment of the whole progress vector: 1 to the count at 0, the
	// change of this worker's last id at 1+w.
	count, slot := make([]int64, 1+n), make([]int64, 1+n)
	count[0], slot[1+w] = 1, 1
	g.upd = op.Add(s.SubScope("update"), op.Const(s.SubScope("count"), count),
		op.Mul(s.SubScope("slot"), op.Const(s.SubScope("slot_mask"), slot), delta))
	if err := s.Err(); err != nil {
		return tf.Output{}, err
	}
	rc.guard = g
	return g.pred, nil
}

// finish adds the op that records the step as applied — the counter and
// this worker's last id, in one AssignAddVariableOp — after every update.
// AssignAddVariableOp updates under the variable's exclusive lock; a
// ResourceScatterAdd of int64 takes a shared one, so that two steps marking
// at once could each overwrite the other's increment.
func (rc *replicaContext) finish() (*tf.Operation, error) {
	if rc.guard == nil {
		return nil, nil
	}
	s := rc.root.SubScope("mark").WithDevice(rc.s.ps[0]).WithControlDependencies(rc.applies...)
	_, upd := op.Switch(s.SubScope("guard"), rc.guard.upd, rc.guard.pred)
	mark := op.AssignAddVariableOp(s.SubScope("assign_add"), rc.w.progress, upd)
	return mark, s.Err()
}

func sanitize(name string) string { return strings.ReplaceAll(name, "/", "_") }

// Assign writes value to v on its ps task, guarded as Minimize's update is:
// a step run again after its worker died writes at most once. The
// variable must be in one piece.
func (rc *replicaContext) Assign(v strategy.Variable, value tf.Output) error {
	return rc.write("Assign", v, value, false)
}

// AssignAdd adds value to v, with Assign's rules.
func (rc *replicaContext) AssignAdd(v strategy.Variable, value tf.Output) error {
	return rc.write("AssignAdd", v, value, true)
}

func (rc *replicaContext) write(kind string, vv strategy.Variable, value tf.Output, add bool) error {
	v, err := rc.own(vv, kind)
	if err != nil {
		return err
	}
	if value.DataType() != v.dtype {
		return fmt.Errorf("%s %q: value is %s, the variable is %s", kind, v.name, graphutil.DTypeName(value.DataType()), graphutil.DTypeName(v.dtype))
	}
	if len(v.shards) > 1 {
		return fmt.Errorf("%s %q: the variable has %d shards; only a variable in one piece can be written", kind, v.name, len(v.shards))
	}
	pred, err := rc.makeGuard([]tf.Output{value})
	if err != nil {
		return err
	}
	sh := v.shards[0]
	s := rc.root.SubScope(sanitize(kind + "_" + v.name)).WithDevice(sh.device)
	_, val := op.Switch(s.SubScope("guard"), value, pred)
	var up *tf.Operation
	if add {
		up = op.AssignAddVariableOp(s.SubScope("assign_add"), rc.w.handle(sh), val)
	} else {
		up = op.AssignVariableOp(s.SubScope("assign"), rc.w.handle(sh), val)
	}
	rc.applies = append(rc.applies, up)
	return s.Err()
}
