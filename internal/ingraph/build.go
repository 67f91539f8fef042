package ingraph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// step is the engine's Step: a replica function compiled for every local
// replica into the engine's graph.
type step struct {
	e           *Engine
	spec        strategy.InputSpec
	names       []string        // input names, sorted
	inputs      [][]tf.Output   // [replica][input]
	globalCount tf.Output       // fed when the engine sees every replica
	counts      []tf.Output     // per-replica example counts, fed otherwise
	hasNext     []tf.Output     // with counts: 1 where the worker has another batch
	anyNext     tf.Output       // with counts: > 0 when some worker has another batch
	nextOps     []*tf.Operation // every replica's part of anyNext's reduction
	outNames    []string
	outputs     [][]tf.Output // [replica][output]
	redNames    []string      // reduced outputs (ReduceOutput), sorted
	targets     []*tf.Operation
	fetches     []tf.Output // outputs flattened replica-major, then the reduced outputs
	acc         *stepAccum  // set when the step accumulates gradients
	trains      bool        // a replica applies gradients (Minimize, ApplyGradients)
}

// Trains reports whether the step applies gradients: a training step,
// not one that evaluates or predicts.
func (st *step) Trains() bool { return st.trains }

// stepOf returns s as this engine's step; nil, which runReplicas refuses,
// when s is not one.
func (e *Engine) stepOf(s strategy.Step) *step {
	st, _ := s.(*step)
	return st
}

// OutputNames returns the names of the step's outputs, sorted: the keys of
// the Result a run returns, reduced outputs included.
func (st *step) OutputNames() []string {
	names := append(append([]string(nil), st.outNames...), st.redNames...)
	sort.Strings(names)
	return names
}

// Build traces fn once per local replica into the strategy's graph and
// returns the compiled Step. spec gives each input's type and per-replica
// shape. Every problem — a replica function's error, an op without a
// gradient, a variable of another strategy, replicas that disagree — is
// reported here, never at run time.
func (e *Engine) Build(spec strategy.InputSpec, fn strategy.ReplicaFn) (strategy.Step, error) {
	if fn == nil {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("nil replica function")}
	}
	if len(spec) == 0 {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("empty input spec")}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("strategy closed")}
	}
	start := time.Now()
	mark := 0
	if e.cfg.VirtualShards > 0 {
		mark = len(e.graph.Operations())
	}
	n := len(e.cfg.Devices)
	root, ns := e.newScope("step")
	st := &step{e: e, spec: spec, names: sortedKeys(spec), inputs: make([][]tf.Output, n), outputs: make([][]tf.Output, n)}
	globals, weights, err := e.stepCounts(root, st)
	if err != nil {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("global batch size: %w", err)}
	}
	ab := &accumBuild{divisors: globals, weights: weights}
	m := newMerger(n, ns)
	rcs := make([]*ReplicaContext, n)
	outs := make([]strategy.Outputs, n)
	for r := range n {
		rs := root.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r])
		rcs[r] = &ReplicaContext{e: e, local: r, scope: rs, reads: map[*variable]tf.Output{}, peers: rcs, globalCount: globals[r], merges: m, acc: ab}
		for _, name := range st.names {
			ts := spec[name]
			st.inputs[r] = append(st.inputs[r], op.Placeholder(rs.SubScope("input_"+sanitize(name)), ts.DType,
				op.PlaceholderShape(tf.MakeShape(ts.Shape...))))
		}
	}
	if err := root.Err(); err != nil {
		return nil, &strategy.BuildError{Replica: -1, Err: err}
	}
	err = m.run(func(r int) error {
		in := strategy.Inputs{}
		for i, name := range st.names {
			in[name] = st.inputs[r][i]
		}
		out, err := fn(rcs[r], in)
		if err != nil {
			return err
		}
		if err := rcs[r].scope.Err(); err != nil {
			return err
		}
		for name, o := range out {
			if o.Op == nil {
				return fmt.Errorf("output %q: no op (was it built from a failed scope?)", name)
			}
		}
		outs[r] = out
		return rcs[r].reduced.Check(out)
	})
	if err != nil {
		if serr := root.Err(); serr != nil {
			return nil, withGraphReport(err, serr)
		}
		return nil, err
	}
	st.outNames = sortedKeys(outs[0])
	for r := range n {
		if len(outs[r]) != len(outs[0]) {
			return nil, &strategy.BuildError{Replica: r, Err: fmt.Errorf("returns outputs %v, replica 0 returns %v", sortedKeys(outs[r]), st.outNames)}
		}
		for _, name := range st.outNames {
			o, ok := outs[r][name]
			if !ok {
				return nil, &strategy.BuildError{Replica: r, Err: fmt.Errorf("does not return output %q that replica 0 returns", name)}
			}
			if o.Op.Type() == "Placeholder" {
				// TensorFlow cannot fetch what it is fed.
				o = op.Identity(root.SubScope(fmt.Sprintf("replica_%d_output_%s", r, sanitize(name))).WithDevice(e.cfg.Devices[r]), o)
			}
			st.outputs[r] = append(st.outputs[r], o)
			st.fetches = append(st.fetches, o)
		}
		st.targets = append(st.targets, rcs[r].targets...)
		st.trains = st.trains || rcs[r].trains
		if st.counts != nil && !ab.accumulates() {
			st.targets = append(st.targets, globals[r].Op, st.nextOps[r])
		}
	}
	st.targets = uniqueOps(st.targets)
	if err := e.buildReduced(root, st, rcs, ab); err != nil {
		return nil, err
	}
	if err := e.finishAccumulation(root, st, ab, globals); err != nil {
		return nil, err
	}
	if e.cfg.VirtualShards > 0 {
		if err := e.refuseIrreproducible(mark); err != nil {
			return nil, &strategy.BuildError{Replica: -1, Err: err}
		}
	}
	e.log.Debug("step built", zap.Int("replicas", n), zap.Strings("inputs", st.names),
		zap.Strings("outputs", st.outNames), zap.Strings("reduced_outputs", st.redNames), zap.Duration("took", time.Since(start)))
	return st, nil
}

// stepCounts builds, for each local replica, the divisor of average losses
// and the examples the replica adds to the count of an accumulated update.
// When this process runs every replica, the divisor is one scalar, fed, and
// replica 0 adds it to the count; otherwise each replica's count is fed and
// counts, and the divisor is their sum across workers, in the graph, since
// no worker knows the others' share of a partial batch — or, in a step that
// accumulates, fed with the run's global count, since its micro-steps do
// not communicate.
func (e *Engine) stepCounts(root *op.Scope, st *step) (globals, weights []tf.Output, err error) {
	n := len(e.cfg.Devices)
	globals, weights = make([]tf.Output, n), make([]tf.Output, n)
	if e.cfg.NumReplicasInSync == n {
		st.globalCount = op.Placeholder(root.SubScope("global_batch_size").WithDevice(e.cfg.HostDevice), tf.Float,
			op.PlaceholderShape(tf.ScalarShape()))
		for r := range n {
			globals[r], weights[r] = st.globalCount, st.globalCount
			if r > 0 {
				weights[r] = op.Const(root.SubScope(fmt.Sprintf("no_count_%d", r)).WithDevice(e.cfg.Devices[r]), float32(0))
			}
		}
		return globals, weights, root.Err()
	}
	counts := make([][]tf.Output, n)
	for r := range n {
		rs := root.SubScope(fmt.Sprintf("count_%d", r)).WithDevice(e.cfg.Devices[r])
		c := op.Placeholder(rs, tf.Float, op.PlaceholderShape(tf.ScalarShape()))
		h := op.Placeholder(rs.SubScope("has_next"), tf.Float, op.PlaceholderShape(tf.ScalarShape()))
		st.counts, st.hasNext = append(st.counts, c), append(st.hasNext, h)
		counts[r], weights[r] = []tf.Output{op.Pack(rs.SubScope("pair"), []tf.Output{c, h})}, c
	}
	// One reduction of the pair gives the divisor and whether any worker
	// has another batch (see dataset.Batch.NeedsAgreement), packed or not.
	sums, err := e.cfg.CrossDeviceOps.BatchReduce(root.SubScope("global_batch_size"), strategy.Sum, counts, e.cfg.Devices)
	if err != nil {
		return nil, nil, err
	}
	for r := range n {
		rs := root.SubScope(fmt.Sprintf("sums_%d", r)).WithDevice(e.cfg.Devices[r])
		pair := op.Unpack(rs, sums[r][0], 2)
		if r == 0 {
			st.anyNext = pair[1]
		}
		st.nextOps = append(st.nextOps, pair[1].Op)
		globals[r] = op.PlaceholderWithDefault(rs.SubScope("divisor"), pair[0], tf.ScalarShape())
	}
	return globals, weights, root.Err()
}

// withGraphReport returns err, of tracing a step, with what the graph
// reports first: the op that could not be added, which is the cause of
// any panic that followed it.
func withGraphReport(err, graphErr error) error {
	report := strings.TrimSpace(firstLine(graphErr))
	if strings.Contains(report, "Duplicate node name") {
		report += " (every op needs a name of its own: build ops with an nn.Builder, or each on r.Scope().SubScope(name))"
	}
	be := &strategy.BuildError{Replica: -1, Err: err}
	if errors.As(err, &be) {
		be = &strategy.BuildError{Replica: be.Replica, Err: be.Err}
	}
	if strings.HasPrefix(report, strings.TrimSpace(firstLine(be.Err))) {
		be.Err = errors.New(report) // the cause is the graph's own error
	} else {
		be.Err = fmt.Errorf("%s; then: %w", report, be.Err)
	}
	return be
}

func firstLine(err error) string {
	s := err.Error()
	for i, c := range s {
		if c == '\n' || (i > 0 && c == '(' && len(s) > i+11 && s[i:i+11] == "(Stacktrace") {
			return s[:i]
		}
	}
	return s
}

// RunReplicas runs one global step with explicit per-replica feeds: feeds[r]
// maps each input name of the step to replica r's tensor; globalCount is the
// number of examples in the global batch across all replicas. For an engine
// whose replicas span workers, the count is instead summed across workers
// from each replica's batch size (the leading dimension of its first input
// by name), and globalCount only has to be positive — except in a step that
// accumulates gradients (WithAccumulation), whose runs do not communicate:
// there AverageLoss divides by globalCount, and the update, which weighs
// each run by its replicas' batch sizes, does not depend on it.
//
// In a step that accumulates, a run that does not apply the update returns
// no reduced outputs; the run that applies returns them averaged over the
// examples of every run of the update (see ReplicaContext.ReduceOutput).
func (e *Engine) RunReplicas(ctx context.Context, st strategy.Step, feeds []map[string]*tf.Tensor, globalCount int) (strategy.Result, error) {
	res, _, err := e.runReplicas(ctx, e.stepOf(st), feeds, globalCount, true, "")
	return res, err
}

// runReplicas is RunReplicas that also says whether any worker has another
// batch, as more, fed for this worker, adds up across workers: in a step
// whose replicas span workers and that does not accumulate; otherwise it
// returns more. An input that does not fit the step fails every worker's
// step, naming it; at prefixes its error ("step 7: ").
func (e *Engine) runReplicas(ctx context.Context, st *step, feeds []map[string]*tf.Tensor, globalCount int, more bool, at string) (strategy.Result, bool, error) {
	if st == nil || st.e != e {
		return nil, false, fmt.Errorf("strategy: Run: the step was built by another strategy")
	}
	if len(feeds) != len(e.cfg.Devices) {
		return nil, false, fmt.Errorf("strategy: Run: %d per-replica inputs, expected %d (one per local replica)", len(feeds), len(e.cfg.Devices))
	}
	if globalCount <= 0 || globalCount > math.MaxInt32 {
		return nil, false, fmt.Errorf("strategy: Run: global batch count %d, expected a positive number", globalCount)
	}
	if err := st.checkInputs(feeds); err != nil {
		return nil, false, e.abortPeers(fmt.Errorf("strategy: Run: %sthe input of worker %d: %w", at, e.cfg.WorkerID, err))
	}
	fm, err := st.feedMap(feeds, globalCount, more)
	if err != nil {
		return nil, false, err
	}
	if err := e.lock(ctx); err != nil {
		return nil, false, err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return nil, false, err
	}
	fetches, targets, applies, err := e.runPlan(ctx, st)
	if err != nil {
		return nil, false, err
	}
	agree := st.anyNext.Op != nil && st.acc == nil
	if agree {
		fetches = append(slices.Clip(fetches), st.anyNext)
	}
	out, err := e.runLocked(ctx, fm, fetches, targets)
	if st.acc != nil {
		e.accum.ran(applies, err)
	}
	if err != nil {
		return nil, false, err
	}
	if agree {
		more = tensorutil.Value(out[len(out)-1]).(float32) > 0
	}
	return st.result(out, len(feeds), applies), more, nil
}

// result maps a run's fetched values to the step's outputs.
func (st *step) result(out []*tf.Tensor, replicas int, applies bool) strategy.Result {
	res := make(strategy.Result, len(st.outNames)+len(st.redNames))
	k := len(st.outNames)
	for j, name := range st.outNames {
		pr := make(strategy.PerReplica, replicas)
		for r := range replicas {
			pr[r] = out[r*k+j]
		}
		res[name] = pr
	}
	for j, name := range st.redNames {
		if applies {
			res[name] = strategy.PerReplica{out[replicas*k+j]}
		}
	}
	return res
}

// feedMap returns the run's feeds, once checkInputs has accepted feeds:
// every replica's inputs, and the global count — one scalar, or
// each replica's batch size when the engine spans workers, with the
// scalar too in a step that accumulates.
func (st *step) feedMap(feeds []map[string]*tf.Tensor, globalCount int, more bool) (map[tf.Output]*tf.Tensor, error) {
	fm := make(map[tf.Output]*tf.Tensor, len(feeds)*(len(st.names)+2)+1)
	for r, feed := range feeds {
		for i, name := range st.names {
			fm[st.inputs[r][i]] = feed[name]
		}
	}
	gc, err := tf.NewTensor(float32(globalCount))
	if err != nil {
		return nil, err
	}
	if st.counts == nil {
		fm[st.globalCount] = gc
		return fm, nil
	}
	hasNext, err := tf.NewTensor(float32(0))
	if more {
		hasNext, err = tf.NewTensor(float32(1))
	}
	if err != nil {
		return nil, err
	}
	for r, feed := range feeds {
		n := int64(0)
		if sh := feed[st.names[0]].Shape(); len(sh) > 0 {
			n = sh[0]
		}
		c, err := tf.NewTensor(float32(n))
		if err != nil {
			return nil, err
		}
		fm[st.counts[r]], fm[st.hasNext[r]] = c, hasNext
		if st.acc != nil {
			fm[st.acc.globals[r]] = gc
		}
	}
	return fm, nil
}

// checkInputs reports the first input of feeds that is missing or does not
// fit the step's spec, naming the replica and the input.
func (st *step) checkInputs(feeds []map[string]*tf.Tensor) error {
	for r, feed := range feeds {
		for _, name := range st.names {
			t, ok := feed[name]
			if !ok || t == nil {
				return fmt.Errorf("replica %d: input %q missing (the step takes %v)", r, name, st.names)
			}
			if err := st.spec[name].Check(name, t); err != nil {
				return fmt.Errorf("replica %d: %w", r, err)
			}
		}
	}
	return nil
}

// withEmptyInputs returns el with every input it lacks fed with no rows:
// the spec's dtype and shape with a batch dimension of 0. Every other
// dimension of such an input must be known.
func (st *step) withEmptyInputs(el map[string]*tf.Tensor) (map[string]*tf.Tensor, error) {
	out := make(map[string]*tf.Tensor, len(st.names))
	for _, name := range st.names {
		if t, ok := el[name]; ok {
			out[name] = t
			continue
		}
		ts := st.spec[name]
		shape := append([]int64{0}, ts.Shape[min(1, len(ts.Shape)):]...)
		if len(ts.Shape) == 0 || slices.Contains(shape[1:], -1) {
			return nil, fmt.Errorf("input %q: no examples, and its shape %v does not say what an input of none looks like (every dimension but the first must be known)", name, ts.Shape)
		}
		t, err := tf.ReadTensor(ts.DType, shape, bytes.NewReader(nil))
		if err != nil {
			return nil, fmt.Errorf("input %q: an input of no rows: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// uniqueOps returns ops without repeats, in their first order: a copy
// that several shards share is written by one op that each of them
// returns.
func uniqueOps(ops []*tf.Operation) []*tf.Operation {
	seen := make(map[*tf.Operation]bool, len(ops))
	out := ops[:0:0]
	for _, o := range ops {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}
