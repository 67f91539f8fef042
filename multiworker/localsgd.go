package multiworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// LocalSGD configures low-communication training (WithLocalSGD). Each
// worker trains alone, on its share of every global batch, with the
// optimizer its steps apply, whose state stays its own; after every Steps
// of its training steps, the workers all-reduce how far their parameters
// moved since the last synchronisation, the outer gradient (the
// parameters then minus now, averaged over the workers), and apply to the
// parameters of then an outer update, SGD with momentum: every worker goes
// on from its result. With OuterRate 1 and no momentum that is local SGD,
// the workers' parameters averaged; DiLoCo (Douillard et al., 2023) trains
// with AdamW inside, and outside with Nesterov momentum, OuterRate 0.7 and
// OuterMomentum 0.9.
type LocalSGD struct {
	// Steps is H: the training steps each worker takes alone between two
	// synchronisations, at least 1.
	Steps int
	// OuterRate is the outer update's learning rate, in (0, 2]; 0 means 1.
	OuterRate float64
	// OuterMomentum is the outer update's momentum, in [0, 1).
	OuterMomentum float64
	// Nesterov takes Nesterov's momentum (DiLoCo's).
	Nesterov bool
	// WarmupSteps makes the first WarmupSteps training steps synchronous
	// (post-local SGD's warm-up): each all-reduces its gradients across
	// the workers, as without local SGD (compressed by WithCompression, if
	// given), so that every worker applies the same update to the same
	// parameters and optimizer state. Local steps, and the outer update
	// with its momentum, begin after the warm-up, from its parameters.
	WarmupSteps int
	// Compression sends the outer gradient over the wire as FP16, BF16 or
	// INT8; None (the default) as float32.
	Compression Compression
	// Fragments splits the synchronised parameters into this many
	// fragments, consecutive in the variables' order and about equal in
	// size, which synchronise in turn (Streaming DiLoCo's fragments,
	// Douillard et al., 2025): fragment f after each training step n with
	// n - WarmupSteps ≡ (f+1)·Steps/Fragments (mod Steps). Each fragment
	// crosses the link every Steps steps, as the whole model would, but a
	// Fragments-th of it at a time. 0 or 1 synchronises them all at once;
	// Steps must be a multiple of Fragments.
	Fragments int
	// Overlap is the training steps that a fragment's outer gradient
	// travels while the worker trains on (Streaming DiLoCo's τ), less
	// than Steps/Fragments: it is taken after the step whose turn it is,
	// all-reduced in the background, and lands Overlap steps later. 0
	// synchronises at once, between two steps.
	Overlap int
	// Mix is the share of its own parameters that a worker keeps where a
	// synchronisation lands (Streaming DiLoCo's α), in [0, 1): each of
	// the fragment's parameters becomes Mix·own + (1-Mix)·anchor. 0 takes
	// the anchors.
	Mix float64
}

// WithLocalSGD trains with local SGD or DiLoCo (see LocalSGD) on tfdist's
// engine: a step's reductions, its gradients' and its losses', span this
// worker's replicas only, and NumReplicasInSync counts them; the data is
// still divided among every worker's replicas (DistributeDataset, which
// needs DATA sharding: every worker must run the same steps), and
// RunReplicas takes this worker's examples as its count. A step's loss and
// metrics are this worker's. The outer state, the parameters of the last
// synchronisation and the outer momentum, are variables of the strategy,
// named "tfdist_local_sgd/...", which checkpoints save. Every worker
// starts from worker 0's initial parameters.
func WithLocalSGD(c LocalSGD) Option { return func(cfg *config) { cfg.localSGD = &c } }

// check refuses settings out of range and options local SGD cannot take.
func (c config) checkLocalSGD() error {
	l := c.localSGD
	if l == nil {
		return nil
	}
	switch {
	case l.Steps < 1:
		return fmt.Errorf("multiworker: WithLocalSGD: Steps %d: expected at least 1 training step between synchronisations", l.Steps)
	case l.OuterRate < 0 || l.OuterRate > 2:
		return fmt.Errorf("multiworker: WithLocalSGD: OuterRate %v: expected a learning rate in (0, 2] (0 takes 1)", l.OuterRate)
	case l.OuterMomentum < 0 || l.OuterMomentum >= 1:
		return fmt.Errorf("multiworker: WithLocalSGD: OuterMomentum %v: expected a momentum in [0, 1)", l.OuterMomentum)
	case l.WarmupSteps < 0:
		return fmt.Errorf("multiworker: WithLocalSGD: WarmupSteps %d: expected 0 or more", l.WarmupSteps)
	case l.Fragments < 0 || l.Fragments > 1 && l.Steps%l.Fragments != 0:
		return fmt.Errorf("multiworker: WithLocalSGD: Fragments %d: expected 0, 1 or a divisor of Steps %d", l.Fragments, l.Steps)
	case l.Overlap < 0 || l.Overlap >= l.Steps/max(1, l.Fragments):
		return fmt.Errorf("multiworker: WithLocalSGD: Overlap %d: expected 0 or more, less than Steps/Fragments = %d", l.Overlap, l.Steps/max(1, l.Fragments))
	case l.Mix < 0 || l.Mix >= 1:
		return fmt.Errorf("multiworker: WithLocalSGD: Mix %v: expected a share in [0, 1)", l.Mix)
	case l.Compression != None && l.Compression.wire() == 0:
		return fmt.Errorf("multiworker: WithLocalSGD: Compression %v: expected none, fp16, bf16 or int8", l.Compression)
	case c.comm != Auto && c.comm != Engine:
		return fmt.Errorf("multiworker: WithLocalSGD with WithCommunication(%v): local SGD synchronises on tfdist's engine", c.comm)
	case c.aggregation != nil:
		return errors.New("multiworker: WithLocalSGD with WithAggregation: a local step all-reduces no gradient to vote on")
	case c.compression != None && (l.WarmupSteps == 0 || c.compression.kind == topK):
		return fmt.Errorf("multiworker: WithLocalSGD with WithCompression(%v): a local step all-reduces no gradient; expected fp16, bf16 or int8 with WarmupSteps, for the warm-up's gradients (compress the outer gradient with LocalSGD.Compression)", c.compression)
	case c.shards > 0:
		return errors.New("multiworker: WithLocalSGD with WithDeterministic: not supported, since the workers' steps do not meet")
	}
	return nil
}

// localSGDStepKey is the output through which a training step returns the
// count of training steps, which Run and RunReplicas take out.
const localSGDStepKey = "tfdist_local_sgd_step"

// localSGD is a Strategy's local SGD: the count of its training steps, the
// parameters of the last synchronisation (anchors) and the step that
// synchronises.
type localSGD struct {
	cfg     LocalSGD
	group   string // the engine group of the outer all-reduce, "" alone
	workers int

	trained atomic.Int64 // the count of the last training step run

	mu      sync.Mutex
	count   strategy.Variable
	vars    []strategy.Variable // the trainable variables synchronised
	anchors []strategy.Variable
	frags   [][]int         // the indices in vars of each fragment's variables
	syncs   []strategy.Step // each fragment's outer update of its anchors
	resets  []strategy.Step // each fragment's parameters take its anchors (mixed)
	settle  strategy.Step   // after the warm-up: the anchors take the parameters
	warm    *warmup         // with WarmupSteps: the training steps' gradient reduction
	overlap *overlap        // with Overlap: the outer gradients in flight
}

// due returns the fragments that synchronise after training step n, in
// order: every one in the warm-up, else the one whose turn it is, if any.
func (l *localSGD) due(n int64) []int {
	p := max(1, l.cfg.Fragments)
	w := int64(l.cfg.WarmupSteps)
	if n <= w {
		return allIndices(p)
	}
	every := int64(l.cfg.Steps / p)
	r := (n - w) % int64(l.cfg.Steps)
	if r%every != 0 {
		return nil
	}
	return []int{int((r/every + int64(p) - 1) % int64(p))}
}

// Build builds the step of fn on the strategy's replicas; under
// WithLocalSGD a training step also counts itself, and the first one
// builds the synchronisation and starts every worker from worker 0's
// parameters.
func (s *Strategy) Build(spec strategy.InputSpec, fn strategy.ReplicaFn) (strategy.Step, error) {
	l := s.localSGD
	if l == nil {
		return s.engine.Build(spec, fn)
	}
	count, err := l.counter(s)
	if err != nil {
		return nil, err
	}
	st, err := s.engine.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		irc, ok := rc.(*ingraph.ReplicaContext)
		if !ok {
			return fn(rc, in)
		}
		before, err := irc.Read(count)
		if err != nil {
			return nil, err
		}
		out, err := l.warm.building(irc, before, l.cfg.WarmupSteps, func() (strategy.Outputs, error) { return fn(rc, in) })
		if err != nil || !irc.Trains() {
			return out, err
		}
		if irc.Accumulates() {
			return nil, errors.New("multiworker: WithLocalSGD: a step that accumulates gradients (WithAccumulation) would synchronise between its micro-steps; accumulate by a larger local batch instead")
		}
		sc := rc.Scope().SubScope("local_sgd_count")
		n := op.AddV2(sc, before, op.Const(sc.SubScope("one"), int64(1)))
		if err := irc.Overwrite(count, n); err != nil {
			return nil, err
		}
		if out == nil {
			out = strategy.Outputs{}
		}
		out[localSGDStepKey] = n
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	if t, ok := st.(interface{ Trains() bool }); ok && t.Trains() {
		err = l.prepare(context.Background(), s)
	}
	return st, err
}

// counter returns the count of training steps, made at the first Build.
func (l *localSGD) counter(s *Strategy) (strategy.Variable, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.count != nil {
		return l.count, nil
	}
	return l.count, s.engine.Scope(func(sc strategy.Scope) (err error) {
		l.count, err = sc.Variable("tfdist_local_sgd/steps", tf.Int64, nil, strategy.Zeros(), strategy.Trainable(false))
		return err
	})
}

// prepare, at the first training step's Build, makes an anchor for every
// trainable variable, builds the synchronisation, and starts every worker
// from worker 0's parameters.
func (l *localSGD) prepare(ctx context.Context, s *Strategy) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.syncs != nil {
		return nil
	}
	for _, v := range s.engine.TrainableVariables() {
		if v.DType() == tf.Float {
			l.vars = append(l.vars, v)
		}
	}
	p := max(1, l.cfg.Fragments)
	if p > len(l.vars) {
		return fmt.Errorf("multiworker: WithLocalSGD: Fragments %d: expected at most %d, the float32 trainable variables to split", p, len(l.vars))
	}
	l.frags = fragments(l.vars, p)
	if err := s.engine.Scope(func(sc strategy.Scope) error {
		for _, v := range l.vars {
			a, err := sc.Variable("tfdist_local_sgd/anchor/"+v.Name(), v.DType(), v.Shape(), strategy.Zeros(), strategy.Trainable(false))
			if err != nil {
				return err
			}
			l.anchors = append(l.anchors, a)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("multiworker: local SGD: %w", err)
	}
	start, err := l.buildSteps(s)
	if err != nil {
		return fmt.Errorf("multiworker: local SGD: %w", err)
	}
	return l.start(ctx, s, start)
}

// buildSteps builds the synchronisation's steps, and returns the one that
// starts every worker from worker 0's parameters.
func (l *localSGD) buildSteps(s *Strategy) (start strategy.Step, err error) {
	l.syncs, l.resets = make([]strategy.Step, len(l.frags)), make([]strategy.Step, len(l.frags))
	for f, idx := range l.frags {
		if l.syncs[f], err = l.buildSync(s, idx); err != nil {
			return nil, err
		}
		if l.resets[f], err = l.each(s, idx, l.reset); err != nil {
			return nil, err
		}
	}
	if l.settle, err = l.each(s, nil, l.anchor); err != nil {
		return nil, err
	}
	if l.cfg.Overlap > 0 {
		if l.overlap, err = l.buildOverlap(s); err != nil {
			return nil, err
		}
	}
	return l.each(s, nil, func(rc *ingraph.ReplicaContext, sc *op.Scope, i int) error {
		x, err := rc.Read(l.vars[i])
		if err != nil {
			return err
		}
		if l.group != "" {
			name := fmt.Sprintf("tfdist_local_sgd/start/%d", i)
			local := s.engine.NumLocalReplicas()
			if x, err = onceAWorker(rc, sc, x, rc.ReplicaID()%local, local, func(sc *op.Scope, x tf.Output) tf.Output {
				return engineops.Broadcast(sc, x, l.group, name, 0)
			}); err != nil {
				return err
			}
		}
		return errors.Join(rc.Overwrite(l.vars[i], x), rc.Overwrite(l.anchors[i], x))
	})
}

// reset builds variable i's taking of its anchor, mixed with the
// worker's own value by Mix.
func (l *localSGD) reset(rc *ingraph.ReplicaContext, sc *op.Scope, i int) error {
	a, err := rc.Read(l.anchors[i])
	if err != nil {
		return err
	}
	if l.cfg.Mix == 0 {
		return rc.Overwrite(l.vars[i], a)
	}
	x, err := rc.Read(l.vars[i])
	if err != nil {
		return err
	}
	mix := float32(l.cfg.Mix)
	own := op.Mul(sc.SubScope("own"), x, op.Const(sc.SubScope("mix"), mix))
	anchor := op.Mul(sc.SubScope("anchor"), a, op.Const(sc.SubScope("rest"), 1-mix))
	return rc.Overwrite(l.vars[i], op.AddV2(sc.SubScope("mixed"), own, anchor))
}

// each builds a step that calls fn for every synchronised variable i of
// idx, or of all of them if idx is nil.
func (l *localSGD) each(s *Strategy, idx []int, fn func(rc *ingraph.ReplicaContext, sc *op.Scope, i int) error) (strategy.Step, error) {
	if idx == nil {
		idx = allIndices(len(l.vars))
	}
	return s.engine.Build(syncSpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
		irc := rc.(*ingraph.ReplicaContext)
		for _, i := range idx {
			if err := fn(irc, rc.Scope().SubScope(fmt.Sprintf("local_sgd_%d", i)), i); err != nil {
				return nil, err
			}
		}
		return strategy.Outputs{}, nil
	})
}

// outer is the outer update.
func (l *localSGD) outer() strategy.Optimizer {
	rate := l.cfg.OuterRate
	if rate == 0 {
		rate = 1
	}
	return optimizer.NewMomentum(optimizer.Constant(rate), float32(l.cfg.OuterMomentum), l.cfg.Nesterov).Named(localSGDPrefix + "outer")
}

// syncSpec is the synchronisation's input: none that it reads.
var syncSpec = strategy.InputSpec{"tfdist_local_sgd_none": {DType: tf.Float, Shape: []int64{}}}

// buildSync builds the synchronisation of the variables idx: each anchor
// takes the outer update of the workers' mean of (anchor - parameters).
func (l *localSGD) buildSync(s *Strategy, idx []int) (strategy.Step, error) {
	local := s.engine.NumLocalReplicas()
	return l.buildOuter(s, idx, func(rc *ingraph.ReplicaContext) ([]tf.Output, error) {
		return l.summed(rc, idx, local)
	})
}

// summed builds the sum over the workers (local replicas a worker) of
// each one's (anchor - parameters) of the variables idx.
func (l *localSGD) summed(rc *ingraph.ReplicaContext, idx []int, local int) ([]tf.Output, error) {
	ds, err := l.deltas(rc, idx)
	if err != nil || l.group == "" {
		return ds, err
	}
	return l.exchange(rc, rc.Scope().SubScope("local_sgd_exchange"), ds, idx, local)
}

// anchor builds variable i's anchor taking its value.
func (l *localSGD) anchor(rc *ingraph.ReplicaContext, _ *op.Scope, i int) error {
	x, err := rc.Read(l.vars[i])
	if err != nil {
		return err
	}
	return rc.Overwrite(l.anchors[i], x)
}

// buildOuter builds a step that gives the anchors of the variables idx
// the outer update of sums, the sum over the workers of each one's
// (anchor - parameters), which each replica builds.
func (l *localSGD) buildOuter(s *Strategy, idx []int, sums func(rc *ingraph.ReplicaContext) ([]tf.Output, error)) (strategy.Step, error) {
	local := s.engine.NumLocalReplicas()
	return s.engine.Build(syncSpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
		ds, err := sums(rc.(*ingraph.ReplicaContext))
		if err != nil {
			return nil, err
		}
		// The mean over the workers, shared among the local replicas,
		// whose gradients ApplyGradients sums.
		grads := make([]tf.Output, len(ds))
		anchors := make([]strategy.Variable, len(ds))
		for k, d := range ds {
			sc := rc.Scope().SubScope(fmt.Sprintf("local_sgd_mean_%d", idx[k]))
			grads[k] = op.Mul(sc, d, op.Const(sc.SubScope("share"), float32(1)/float32(l.workers*local)))
			anchors[k] = l.anchors[idx[k]]
		}
		return strategy.Outputs{}, rc.ApplyGradients(l.outer(), grads, anchors)
	})
}

// deltas builds this worker's (anchor - parameters) of the variables idx.
func (l *localSGD) deltas(rc *ingraph.ReplicaContext, idx []int) ([]tf.Output, error) {
	ds := make([]tf.Output, len(idx))
	for k, i := range idx {
		x, err := rc.Read(l.vars[i])
		if err != nil {
			return nil, err
		}
		a, err := rc.Read(l.anchors[i])
		if err != nil {
			return nil, err
		}
		ds[k] = op.Sub(rc.Scope().SubScope(fmt.Sprintf("local_sgd_%d", i)), a, x)
	}
	return ds, nil
}

// exchange sums ds, the outer gradient of the variables idx, over the
// workers (local replicas a worker) as one flat buffer: one all-reduce a
// synchronisation (of a fragment), which above the engine's direct size
// goes along the ring, 2(n-1)/n of the buffer sent a worker, not (n-1)
// times each small variable.
func (l *localSGD) exchange(rc strategy.Replica, sc *op.Scope, ds []tf.Output, idx []int, local int) ([]tf.Output, error) {
	name := fmt.Sprintf("tfdist_local_sgd/%d", idx[0])
	sum, err := onceAWorker(rc, sc, l.pack(sc, ds), rc.ReplicaID()%local, local, func(sc *op.Scope, d tf.Output) tf.Output {
		return engineops.AllReduce(sc, d, l.group, name, collective.Sum, l.cfg.Compression.wire())
	})
	if err != nil {
		return nil, err
	}
	return l.unpack(sc, sum, idx), sc.Err()
}

// pack flattens ds into one vector, in order.
func (l *localSGD) pack(sc *op.Scope, ds []tf.Output) tf.Output {
	minusOne := op.Const(sc.SubScope("minus_one"), []int32{-1})
	flat := make([]tf.Output, len(ds))
	for k, d := range ds {
		flat[k] = op.Reshape(sc.SubScope(fmt.Sprintf("flat_%d", k)), d, minusOne)
	}
	if len(flat) == 1 {
		return flat[0]
	}
	return op.ConcatV2(sc.SubScope("pack"), flat, op.Const(sc.SubScope("axis"), int32(0)))
}

// unpack cuts a vector that pack made of the variables idx back into
// tensors of their shapes.
func (l *localSGD) unpack(sc *op.Scope, flat tf.Output, idx []int) []tf.Output {
	sizes := make([]int64, len(idx))
	for k, i := range idx {
		sizes[k] = tensorutil.NumElements(l.vars[i].Shape())
	}
	parts := []tf.Output{flat}
	if len(idx) > 1 {
		parts = op.SplitV(sc.SubScope("unpack"), flat, op.Const(sc.SubScope("sizes"), sizes), op.Const(sc.SubScope("axis"), int32(0)), int64(len(idx)))
	}
	out := make([]tf.Output, len(idx))
	for k, i := range idx {
		out[k] = op.Reshape(sc.SubScope(fmt.Sprintf("shape_%d", k)), parts[k], op.Const(sc.SubScope(fmt.Sprintf("of_%d", k)), l.vars[i].Shape()))
	}
	return out
}

// onceAWorker returns what exchange, an op of the engine's group, makes
// of d on replica 0 of this worker, on every local replica (r of local),
// whose d is the same: the link carries it once a worker.
func onceAWorker(rc strategy.Replica, sc *op.Scope, d tf.Output, r, local int, exchange func(*op.Scope, tf.Output) tf.Output) (tf.Output, error) {
	if r == 0 {
		d = exchange(sc.WithDevice(strategy.LocalCPU(0)).SubScope("exchange"), d)
	} else {
		d = op.ZerosLike(sc.SubScope("taken"), d)
	}
	if local == 1 {
		return d, nil
	}
	return rc.AllReduce(strategy.Sum, d)
}

// start gives every worker worker 0's parameters, and the anchors them,
// unless the training steps' count says the job has begun (a restore).
func (l *localSGD) start(ctx context.Context, s *Strategy, start strategy.Step) error {
	n, err := l.steps(ctx, s)
	if err != nil || n > 0 {
		return err
	}
	return l.run(ctx, s, start)
}

// run runs step, one of the synchronisation's.
func (l *localSGD) run(ctx context.Context, s *Strategy, step strategy.Step) error {
	none, err := tf.NewTensor(float32(0))
	if err != nil {
		return err
	}
	feeds := make([]map[string]*tf.Tensor, s.engine.NumLocalReplicas())
	for r := range feeds {
		feeds[r] = map[string]*tf.Tensor{"tfdist_local_sgd_none": none}
	}
	_, err = s.engine.RunReplicas(ctx, step, feeds, 1)
	return err
}

// steps returns the count of training steps.
func (l *localSGD) steps(ctx context.Context, s *Strategy) (int64, error) {
	t, err := s.engine.Value(ctx, l.count)
	if err != nil {
		return 0, err
	}
	return t.Value().(int64), nil
}

// synchronise runs the synchronisations due after training step n: each
// fragment's anchors take the outer update, and its parameters the
// anchors.
func (l *localSGD) synchronise(ctx context.Context, s *Strategy, n int64) error {
	switch w := int64(l.cfg.WarmupSteps); {
	case n < w: // the step all-reduced its gradients
		return nil
	case n == w:
		if err := l.run(ctx, s, l.settle); err != nil {
			return fmt.Errorf("multiworker: local SGD: anchor the parameters after the warm-up's last step %d: %w", n, err)
		}
		return nil
	}
	if l.overlap != nil {
		return l.overlap.after(ctx, s, l, n)
	}
	for _, f := range l.due(n) {
		begin := time.Now()
		if err := l.update(ctx, s, l.syncs[f], f); err != nil {
			return fmt.Errorf("multiworker: local SGD: synchronise fragment %d after step %d: %w", f, n, err)
		}
		l.observe(s, fmt.Sprintf("synchronise fragment %d after step %d", f, n), begin)
	}
	return nil
}

// update runs outer, an outer update of fragment f's anchors, then the
// fragment's reset.
func (l *localSGD) update(ctx context.Context, s *Strategy, outer strategy.Step, f int) error {
	if err := l.run(ctx, s, outer); err != nil {
		return err
	}
	return l.run(ctx, s, l.resets[f])
}

// observe records the synchronisation name that began at begin, and ends
// now, in the timeline and the metrics.
func (l *localSGD) observe(s *Strategy, name string, begin time.Time) {
	o := s.obs
	if o == nil {
		return
	}
	if o.rec != nil {
		o.rec.Add(timeline.Span{Phase: timeline.Sync, Name: name, Start: begin, End: time.Now()})
	}
	if o.m != nil {
		o.m.Syncs.Inc()
	}
}

// after takes the count of training steps out of a step's result and
// synchronises when due.
func (l *localSGD) after(ctx context.Context, s *Strategy, res strategy.Result) error {
	counts, ok := res[localSGDStepKey]
	if !ok {
		return nil
	}
	delete(res, localSGDStepKey)
	local := s.engine.LocalResults(counts)
	if len(local) == 0 {
		return nil
	}
	n := local[0].Value().(int64)
	l.trained.Store(n)
	return l.synchronise(ctx, s, n)
}

// meeting reports whether the workers last met, at the synchronisation
// after the last training step (or before the first): an elastic job's
// workers agree on a change of members only there, since between two
// synchronisations they step without waiting for one another.
func (l *localSGD) meeting() bool { return len(l.due(l.trained.Load())) > 0 }

// fragments cuts vars into p runs of consecutive variables of about equal
// elements: run f ends at the first variable that brings the elements so
// far to (f+1)/p of all. It returns each run's indices; p is at most
// len(vars).
func fragments(vars []strategy.Variable, p int) [][]int {
	var total int64
	sizes := make([]int64, len(vars))
	for i, v := range vars {
		sizes[i] = max(1, tensorutil.NumElements(v.Shape()))
		total += sizes[i]
	}
	out := make([][]int, p)
	var sum int64
	f := 0
	for i, n := range sizes {
		out[f] = append(out[f], i)
		sum += n
		// Leave at least one variable for each later fragment.
		if f < p-1 && (sum*int64(p) >= total*int64(f+1) || len(vars)-i-1 == p-f-1) {
			f++
		}
	}
	return out
}

// allIndices returns 0, 1, …, n-1.
func allIndices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// localCrossDeviceOps reduces across a worker's own replicas: on the
// first of its devices when they are all GPUs, else on its host CPU.
func localCrossDeviceOps(devices []string) strategy.CrossDeviceOps {
	on := strategy.LocalCPU(0)
	if ingraph.RequireGPUs(devices) == nil {
		on = devices[0]
	}
	return ingraph.ReductionToOneDevice{Device: on}
}

// RunReplicas runs step on one batch per local replica (see
// ingraph.Engine.RunReplicas); under WithLocalSGD count is this worker's
// examples, and a training step is followed, when due, by a
// synchronisation.
func (s *Strategy) RunReplicas(ctx context.Context, step strategy.Step, feeds []map[string]*tf.Tensor, count int) (strategy.Result, error) {
	res, err := s.engine.RunReplicas(ctx, step, feeds, count)
	if err == nil && s.localSGD != nil {
		err = s.localSGD.after(ctx, s, res)
	}
	return res, err
}
