package ingraph

import (
	"errors"
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// ReplicaContext is the in-graph engine's Replica: which replica it is, a
// scope pinned to its device, and the cross-replica operations (AllReduce,
// AllGather, ApplyGradients) that combine it with the other replicas. A step
// function that needs more than Replica (Gradients and ApplyGradients, say)
// type-asserts its Replica to *ReplicaContext.
//
// Cross-replica operations are merge points: every replica must call the same
// ones in the same order, as in tf.distribute. Build traces replicas one at a
// time and, at each merge point, builds the combined ops once all replicas
// have reached it.
type ReplicaContext struct {
	e           *Engine
	local       int
	scope       *op.Scope
	reads       map[*variable]tf.Output
	readOps     []*tf.Operation
	peers       []*ReplicaContext // every local replica's, for the reads of copies that shards share
	targets     []*tf.Operation
	trains      bool // ApplyGradients was called
	globalCount tf.Output
	merges      *merger
	nGrad       int
	reduced     strategy.ReducedOutputs
	acc         *accumBuild
	taps        []tap // the replica's differentiable all-reduces
}

// ReplicaID returns the replica's id among all replicas in sync.
func (rc *ReplicaContext) ReplicaID() int { return rc.e.cfg.FirstReplicaID + rc.local }

// LocalReplica returns the replica's index in this process.
func (rc *ReplicaContext) LocalReplica() int { return rc.local }

// NumReplicasInSync returns the number of replicas across all workers.
func (rc *ReplicaContext) NumReplicasInSync() int { return rc.e.cfg.NumReplicasInSync }

// Device returns the replica's device.
func (rc *ReplicaContext) Device() string { return rc.e.cfg.Devices[rc.local] }

// Scope returns a graph scope pinned to the replica's device. Give every op
// its own sub-scope (graft does not make names unique).
func (rc *ReplicaContext) Scope() *op.Scope { return rc.scope }

// GlobalBatchSize returns a float32 scalar fed every step with the number of
// examples in the global batch across all replicas: the divisor of an
// average loss. It equals the global batch size except for a partial last
// batch.
func (rc *ReplicaContext) GlobalBatchSize() tf.Output { return rc.globalCount }

// Read returns the value of this replica's copy of v. Within one step every
// read of a variable gives the value it had when the step began, and Minimize
// differentiates with respect to these reads.
func (rc *ReplicaContext) Read(vv strategy.Variable) (tf.Output, error) {
	v, err := rc.e.own(vv, "Read")
	if err != nil {
		return tf.Output{}, err
	}
	if out, ok := rc.reads[v]; ok {
		return out, nil
	}
	// The shards of a device that share a copy share its read too: one
	// op, in the scope of the shard that holds the copy, whose value every
	// shard's kernels take as they took their own read's.
	holder := rc
	if h := rc.e.holder(v, rc.local); h != rc.local {
		holder = rc.peers[h]
	}
	out, ok := holder.reads[v]
	if !ok {
		s := holder.scope.SubScope("read_" + sanitize(v.name))
		out = op.ReadVariableOp(s, v.handles[holder.local], v.dtype)
		if err := s.Err(); err != nil {
			return tf.Output{}, err
		}
		holder.reads[v] = out
		holder.readOps = append(holder.readOps, out.Op)
	}
	if holder != rc {
		rc.reads[v] = out
		rc.readOps = append(rc.readOps, out.Op)
	}
	return out, nil
}

// Lookup returns the rows of v that ids name: a gather from this replica's
// read of v, so that Minimize differentiates it like any read and updates
// the whole variable.
func (rc *ReplicaContext) Lookup(v strategy.Variable, ids tf.Output) (tf.Output, error) {
	val, err := rc.Read(v)
	if err != nil {
		return tf.Output{}, err
	}
	return graphutil.LookupRows(rc.scope.SubScope("lookup_"+sanitize(v.Name())), v.Name(), v.Shape(), val, ids)
}

// AddTarget makes op run every step (a metric update, say).
func (rc *ReplicaContext) AddTarget(o *tf.Operation) { rc.targets = append(rc.targets, o) }

// AllReduce combines value across all replicas in sync and returns the result
// on this replica's device. It is a merge point. The gradient of a loss
// passes through a sum or a mean of floating-point values as
// tf.distribute's does (see Gradients); not through Min or Max.
func (rc *ReplicaContext) AllReduce(red strategy.ReduceOp, value tf.Output) (tf.Output, error) {
	out, err := rc.allReduce(red, value, "AllReduce")
	if err != nil {
		return tf.Output{}, err
	}
	return rc.tap(red, value, out)
}

// allReduce is AllReduce, a merge point of the given kind, without its
// gradient.
func (rc *ReplicaContext) allReduce(red strategy.ReduceOp, value tf.Output, kind string) (tf.Output, error) {
	res, err := rc.merges.call(rc.local, kind, value, func(args []any) ([]any, error) {
		vals := make([][]tf.Output, len(args))
		for r, a := range args {
			vals[r] = []tf.Output{a.(tf.Output)}
		}
		out, err := rc.e.cfg.CrossDeviceOps.BatchReduce(rc.e.namespace("all_reduce"), red, vals, rc.e.cfg.Devices)
		if err != nil {
			return nil, err
		}
		return perReplicaAny(out, func(o []tf.Output) any { return o[0] }), nil
	})
	if err != nil {
		return tf.Output{}, err
	}
	// Run it every step even if this replica does not use it: a collective
	// completes only when every replica joins.
	rc.targets = append(rc.targets, res.(tf.Output).Op)
	rc.acc.communicates = append(rc.acc.communicates, kind)
	return res.(tf.Output), nil
}

// AllGather concatenates value from all replicas along axis 0, in replica
// order, and returns the result on this replica's device; a scalar is an
// error. It is a merge point.
func (rc *ReplicaContext) AllGather(value tf.Output) (tf.Output, error) {
	if value.Shape().NumDimensions() == 0 {
		return tf.Output{}, fmt.Errorf("strategy: AllGather: replica %d's value is a scalar of %s: %w", rc.ReplicaID(), graphutil.DTypeName(value.DataType()), errGatherScalar)
	}
	res, err := rc.merges.call(rc.local, "AllGather", value, func(args []any) ([]any, error) {
		vals := make([][]tf.Output, len(args))
		for r, a := range args {
			vals[r] = []tf.Output{a.(tf.Output)}
		}
		out, err := rc.e.cfg.CrossDeviceOps.BatchGather(rc.e.namespace("all_gather"), vals, rc.e.cfg.Devices)
		if err != nil {
			return nil, err
		}
		return perReplicaAny(out, func(o []tf.Output) any { return o[0] }), nil
	})
	if err != nil {
		return tf.Output{}, err
	}
	rc.targets = append(rc.targets, res.(tf.Output).Op)
	rc.acc.communicates = append(rc.acc.communicates, "AllGather")
	return res.(tf.Output), nil
}

func perReplicaAny(out [][]tf.Output, pick func([]tf.Output) any) []any {
	res := make([]any, len(out))
	for r := range out {
		res[r] = pick(out[r])
	}
	return res
}

// Gradients returns the gradients of loss with respect to this replica's
// reads of vars, from TensorFlow's gradient registry. An op with no
// registered gradient, or a variable the loss does not depend on, is an
// error. Where loss depends on an AllReduce (a sum or a mean), the
// gradient passes through it as tf.distribute's does: the gradients with
// respect to its result are all-reduced across the replicas and continue
// into each replica's input, so Gradients is then a merge point.
func (rc *ReplicaContext) Gradients(loss tf.Output, vars []strategy.Variable) ([]tf.Output, error) {
	return rc.gradients(loss, vars, true)
}

// gradients is Gradients; throughTaps false leaves out the all-reduces'
// gradients, for a loss that does not depend on one.
func (rc *ReplicaContext) gradients(loss tf.Output, vars []strategy.Variable, throughTaps bool) ([]tf.Output, error) {
	if len(vars) == 0 {
		return nil, errors.New("Gradients: no variables")
	}
	xs := make([]tf.Output, len(vars))
	for i, v := range vars {
		if !v.Trainable() {
			return nil, fmt.Errorf("Gradients: variable %q is not trainable", v.Name())
		}
		r, err := rc.Read(v)
		if err != nil {
			return nil, err
		}
		xs[i] = r
	}
	if err := rc.scope.Err(); err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("%s/gradients_%d", rc.scopeName(), rc.nGrad)
	rc.nGrad++
	ys, dys := []tf.Output{loss}, []tf.Output(nil)
	if throughTaps && len(rc.taps) > 0 {
		var err error
		if ys, dys, err = rc.throughTaps(prefix, loss); err != nil {
			return nil, fmt.Errorf("gradients of %q: %w", loss.Op.Name(), err)
		}
	}
	grads, err := rc.e.graph.AddGradients(prefix, ys, xs, dys)
	if err != nil {
		if strings.Contains(err.Error(), "unreachable from the output") {
			for i, x := range xs {
				if strings.Contains(err.Error(), "'"+x.Op.Name()+"'") {
					return nil, fmt.Errorf("gradients of %q: the loss does not depend on variable %q", loss.Op.Name(), vars[i].Name())
				}
			}
		}
		return nil, fmt.Errorf("gradients of %q: %w", loss.Op.Name(), err)
	}
	for i, g := range grads {
		if g.Op == nil {
			return nil, fmt.Errorf("gradients of %q: the loss does not depend on variable %q", loss.Op.Name(), vars[i].Name())
		}
	}
	return grads, nil
}

func (rc *ReplicaContext) scopeName() string {
	return fmt.Sprintf("%s/replica_%d", rc.merges.ns, rc.local)
}

// Minimize computes the gradients of loss with respect to vars, sums them
// across all replicas and applies them with opt to every copy: the
// synchronous data-parallel update. loss must already be scaled for the
// global batch (see AverageLoss). It is a merge point. Lookups are
// differentiated like reads, so a sparse optimizer does not apply;
// WithAccumulation does. An opt that is a LossScaler has the loss it
// differentiates scaled. An opt that is a PrivateOptimizer (DP-SGD) takes
// loss as one unscaled value per example instead: see PrivateOptimizer.
func (rc *ReplicaContext) Minimize(opt strategy.Optimizer, loss tf.Output, vars []strategy.Variable, opts ...strategy.MinimizeOption) error {
	cfg, err := strategy.NewMinimizeConfig(opts...)
	if err != nil {
		return fmt.Errorf("Minimize: %w", err)
	}
	if po, ok := opt.(strategy.PrivateOptimizer); ok {
		if cfg.Accumulation > 1 {
			return fmt.Errorf("Minimize: DP-SGD with WithAccumulation(%d): accumulation is not supported with DP-SGD; use a larger batch", cfg.Accumulation)
		}
		grads, err := rc.privateGradients(po, loss, vars)
		if err != nil {
			return fmt.Errorf("Minimize: %w", err)
		}
		return rc.applyGradients(opt, grads, vars, cfg)
	}
	if ls, ok := opt.(strategy.LossScaler); ok {
		if loss, err = rc.scaleLoss(ls, loss); err != nil {
			return err
		}
	}
	grads, err := rc.Gradients(loss, vars)
	if err != nil {
		return err
	}
	return rc.applyGradients(opt, grads, vars, cfg)
}

// scaleLoss returns loss multiplied by ls's factor for this replica.
func (rc *ReplicaContext) scaleLoss(ls strategy.LossScaler, loss tf.Output) (tf.Output, error) {
	s := rc.scope.SubScope("loss_scale")
	f, err := ls.LossScale(&applyContext{e: rc.e, scope: s, replica: rc.local})
	if err != nil {
		return tf.Output{}, fmt.Errorf("loss scale: %w", err)
	}
	f = graphutil.CastTo(s, f, loss.DataType())
	return op.Mul(s.SubScope("scaled"), loss, f), s.Err()
}

type applyArgs struct {
	grads []tf.Output
	vars  []*variable
	reads []*tf.Operation
}

// ApplyGradients sums grads across all replicas and applies the sums to vars
// with opt on every replica. It is a merge point. Of opts, only
// WithAccumulation applies: see Minimize.
func (rc *ReplicaContext) ApplyGradients(opt strategy.Optimizer, grads []tf.Output, vars []strategy.Variable, opts ...strategy.MinimizeOption) error {
	cfg, err := strategy.NewMinimizeConfig(opts...)
	if err != nil {
		return fmt.Errorf("ApplyGradients: %w", err)
	}
	return rc.applyGradients(opt, grads, vars, cfg)
}

func (rc *ReplicaContext) applyGradients(opt strategy.Optimizer, grads []tf.Output, vars []strategy.Variable, cfg strategy.MinimizeConfig) error {
	if opt == nil {
		return errors.New("ApplyGradients: nil optimizer")
	}
	if len(grads) != len(vars) {
		return fmt.Errorf("ApplyGradients: %d gradients for %d variables", len(grads), len(vars))
	}
	own := make([]*variable, len(vars))
	for i, vv := range vars {
		v, err := rc.e.own(vv, "ApplyGradients")
		if err != nil {
			return err
		}
		if v.sync != strategy.OnWrite {
			return fmt.Errorf("ApplyGradients: variable %q is %v; only OnWrite variables are trained", v.name, v.sync)
		}
		own[i] = v
	}
	if err := rc.acc.use(cfg.Accumulation); err != nil {
		return fmt.Errorf("ApplyGradients: %w", err)
	}
	args := applyArgs{grads: grads, vars: own, reads: append([]*tf.Operation(nil), rc.readOps...)}
	res, err := rc.merges.call(rc.local, "ApplyGradients", args, func(all []any) ([]any, error) {
		return rc.e.mergeApply(opt, all, rc.acc)
	})
	if err != nil {
		return err
	}
	if rc.acc.accumulates() {
		rc.acc.apply = append(rc.acc.apply, res.(*tf.Operation))
	} else {
		rc.targets = append(rc.targets, res.(*tf.Operation))
	}
	rc.trains = true
	return nil
}

func (e *Engine) mergeApply(opt strategy.Optimizer, all []any, ab *accumBuild) ([]any, error) {
	first := all[0].(applyArgs)
	vals := make([][]tf.Output, len(all))
	for r, a := range all {
		args := a.(applyArgs)
		if len(args.vars) != len(first.vars) {
			return nil, fmt.Errorf("replica %d applies %d variables, replica 0 applies %d", r, len(args.vars), len(first.vars))
		}
		for i := range args.vars {
			if args.vars[i] != first.vars[i] {
				return nil, fmt.Errorf("replica %d applies %q where replica 0 applies %q", r, args.vars[i].name, first.vars[i].name)
			}
		}
		vals[r] = args.grads
	}
	// A copy shared by a device's shards is updated once, after every
	// shard's reads of it.
	reads := make([][]*tf.Operation, len(all))
	for r, a := range all {
		reads[e.shared[r]] = append(reads[e.shared[r]], a.(applyArgs).reads...)
	}
	if e.cfg.Sharding != nil {
		return e.mergeApplySharded(opt, first.vars, vals, reads, ab)
	}
	s := e.namespace("apply_gradients")
	reduced, err := e.reduceGradients(s.SubScope("all_reduce"), ab, first.vars, vals)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(all))
	for r := range all {
		if o := e.shared[r]; o != r {
			out[r] = out[o]
			continue
		}
		rs := s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]).
			WithControlDependencies(reads[r]...)
		ac := &applyContext{e: e, scope: rs, replica: r}
		vars := make([]strategy.Variable, len(first.vars))
		for i, v := range first.vars {
			vars[i] = v
		}
		o, err := opt.Apply(ac, reduced[r], vars)
		if err != nil {
			return nil, fmt.Errorf("optimizer: %w", err)
		}
		if err := s.Err(); err != nil {
			return nil, err
		}
		out[r] = o
	}
	return out, nil
}

// Trains reports whether the replica function applied gradients so far
// (Minimize, ApplyGradients).
func (rc *ReplicaContext) Trains() bool { return rc.trains }

// Accumulates reports whether the step accumulates gradients over
// micro-steps (WithAccumulation).
func (rc *ReplicaContext) Accumulates() bool { return rc.acc != nil && rc.acc.accumulates() }

// Overwrite writes value to this replica's copy of v, whatever v's
// aggregation: every replica writing the same value keeps the copies
// equal.
func (rc *ReplicaContext) Overwrite(vv strategy.Variable, value tf.Output) error {
	v, err := rc.e.own(vv, "Overwrite")
	if err != nil {
		return err
	}
	if rc.e.cfg.VirtualShards > 0 {
		return fmt.Errorf("Overwrite %q: virtual shards share their device's copies", v.name)
	}
	if value.DataType() != v.dtype {
		return fmt.Errorf("Overwrite %q: value is %s, the variable is %s", v.name, graphutil.DTypeName(value.DataType()), graphutil.DTypeName(v.dtype))
	}
	s := rc.scope.SubScope("overwrite_" + sanitize(v.name))
	rc.targets = append(rc.targets, op.AssignVariableOp(s, v.handles[rc.local], value))
	return s.Err()
}

// AverageLoss returns the sum of every element of perExample divided by
// the examples of the global step (the count Run feeds, or the sum of
// every replica's batch all-reduced across workers; 0 when it is 0). When
// perExample holds one value per example, the gradients summed over the
// replicas are those of the mean over the global batch that one device
// computes, a partial batch included. It is tf.nn.compute_average_loss
// with that count as global_batch_size, not with its default divisor
// (nn.ComputeAverageLoss): for a per-token loss it is the tokens per
// example times the mean per token.
func (rc *ReplicaContext) AverageLoss(perExample tf.Output) tf.Output {
	return graphutil.AverageLoss(rc.scope.SubScope("average_loss"), perExample, rc.globalCount)
}

func sanitize(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c == '/' {
			b[i] = '_'
		}
	}
	return string(b)
}

// Assign writes value to v from inside a replica, with tf.distribute's rules:
// an OnRead variable takes each replica's own value; an OnWrite variable needs
// an aggregation (Sum or Mean combine the replicas' values, OnlyFirstReplica
// takes replica 0's) and every copy receives the result — without one it is
// an error. For OnWrite variables it is a merge point.
func (rc *ReplicaContext) Assign(v strategy.Variable, value tf.Output) error {
	return rc.write("Assign", v, value, false)
}

// AssignAdd adds value to v from inside a replica, with Assign's rules.
func (rc *ReplicaContext) AssignAdd(v strategy.Variable, value tf.Output) error {
	return rc.write("AssignAdd", v, value, true)
}

func (rc *ReplicaContext) write(kind string, vv strategy.Variable, value tf.Output, add bool) error {
	v, err := rc.e.own(vv, kind)
	if err != nil {
		return err
	}
	if value.DataType() != v.dtype {
		return fmt.Errorf("%s %q: value is %s, the variable is %s", kind, v.name, graphutil.DTypeName(value.DataType()), graphutil.DTypeName(v.dtype))
	}
	assign := func(s *op.Scope, h, val tf.Output) *tf.Operation {
		if add {
			return op.AssignAddVariableOp(s, h, val)
		}
		return op.AssignVariableOp(s, h, val)
	}
	if v.sync == strategy.OnRead {
		s := rc.scope.SubScope(sanitize(kind + "_" + v.name))
		rc.targets = append(rc.targets, assign(s, v.handles[rc.local], value))
		return s.Err()
	}
	if v.agg == strategy.AggregationNone {
		return fmt.Errorf("%s %q in a replica: the variable is OnWrite with aggregation NONE, so replicas' writes cannot be combined; create it with WithAggregation(AggregationSum, AggregationMean or AggregationOnlyFirstReplica)", kind, v.name)
	}
	res, err := rc.merges.call(rc.local, kind, value, func(args []any) ([]any, error) {
		s := rc.e.namespace(sanitize(kind + "_" + v.name))
		var combined []tf.Output
		if v.agg == strategy.AggregationOnlyFirstReplica {
			if b, ok := rc.e.cfg.CrossDeviceOps.(Broadcaster); ok && rc.e.cfg.NumReplicasInSync > len(args) {
				// Global replica 0 lives on one worker: broadcast its value.
				vals, err := b.Broadcast(s.SubScope("first"), args[0].(tf.Output), rc.e.cfg.Devices)
				if err != nil {
					return nil, err
				}
				combined = vals
			} else {
				for r := range args {
					combined = append(combined, op.Identity(s.SubScope(fmt.Sprintf("first_to_%d", r)).WithDevice(rc.e.cfg.Devices[r]), args[0].(tf.Output)))
				}
			}
		} else {
			vals := make([][]tf.Output, len(args))
			for r, a := range args {
				vals[r] = []tf.Output{a.(tf.Output)}
			}
			red, err := rc.e.cfg.CrossDeviceOps.BatchReduce(s.SubScope("reduce"), reduceOpOf(v.agg), vals, rc.e.cfg.Devices)
			if err != nil {
				return nil, err
			}
			for r := range red {
				combined = append(combined, red[r][0])
			}
		}
		out := make([]any, len(args))
		for r := range args {
			if o := rc.e.holder(v, r); o != r {
				out[r] = out[o]
				continue
			}
			out[r] = assign(s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(rc.e.cfg.Devices[r]), v.handles[r], combined[r])
		}
		return out, s.Err()
	})
	if err != nil {
		return err
	}
	rc.targets = append(rc.targets, res.(*tf.Operation))
	rc.acc.communicates = append(rc.acc.communicates, fmt.Sprintf("%s of OnWrite variable %q", kind, v.name))
	return nil
}

var _ strategy.Replica = (*ReplicaContext)(nil)
