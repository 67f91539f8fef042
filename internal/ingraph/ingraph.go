package ingraph

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/ctxsync"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/strategy"
)

// Config configures an Engine engine. Strategies fill it; programs use the
// strategies' constructors.
type Config struct {
	// Name names the strategy in logs and errors ("default", "mirrored", …).
	Name string
	// Devices are the full names of this process's replica devices, one
	// replica per device, e.g. /job:localhost/replica:0/task:0/device:CPU:1.
	Devices []string
	// HostDevice is the CPU device for host-side ops (defaults to the CPU:0
	// of the first device's task).
	HostDevice string
	// NumReplicasInSync is the number of replicas across all workers
	// (defaults to len(Devices)).
	NumReplicasInSync int
	// FirstReplicaID is the global id of this process's first replica.
	FirstReplicaID int
	// VirtualShards, when positive, makes the engine's replicas virtual
	// shards: VirtualShards replicas in sync whatever the devices, each
	// device of Devices running VirtualShards / NumReplicasInSync of them
	// (see VirtualDevices). CrossDeviceOps must then combine replicas in
	// tree order, and DistributeDataset gives each virtual shard the same
	// examples on every topology (dataset.ShardBatch).
	VirtualShards int
	// NumWorkers and WorkerID place this process among the input pipelines
	// (defaults 1 and 0).
	NumWorkers, WorkerID int
	// IndependentSteps makes the workers step independently (local SGD):
	// NumReplicasInSync counts this worker's replicas, which a step's
	// reductions span and its average losses divide this worker's examples
	// among, while the data is still divided among every worker's
	// replicas (InputContext), so that every worker takes its share of
	// each global batch.
	IndependentSteps bool
	// CrossDeviceOps reduces values across replicas; required.
	CrossDeviceOps strategy.CrossDeviceOps
	// GradientReducer, when set, sums the gradients of a step in place of
	// CrossDeviceOps (a robust aggregation rule); a step that accumulates
	// gradients (WithAccumulation) then fails to build.
	GradientReducer GradientReducer
	// Sharding, when set, shards the optimizer state of synchronous steps
	// across the workers (see Sharding).
	Sharding Sharding
	// Session is the session's target ("" for the in-process runtime, or a
	// server's, such as grpc://localhost:2222) and its serialized
	// ConfigProto; nil is the in-process runtime with TensorFlow's
	// defaults.
	Session *tf.SessionOptions
	// Logger receives structured logs (default: none).
	Logger *zap.Logger
	// DiagnoseRunError, when set, rewrites an error of a session run, e.g. to
	// name the peer task that died. When the error it returns wraps
	// ErrCannotContinue, the engine refuses every later run.
	DiagnoseRunError func(error) error
	// AbortPeers, when set, breaks the collective operations between the
	// workers with a reason that every peer's pending and later operations
	// fail with. The engine calls it when this worker cannot take part in
	// a step (its input failed, see dataset.Batch.Err) and when a run's
	// context ends while the run may wait in a collective, so that the
	// run returns; either way it then refuses every later run.
	AbortPeers func(error)
	// PendingInit, when set, returns the initialisers that have not run of
	// state kept outside the variables (TopK's residuals), and a function
	// that records that they ran: the engine runs them with the variables'
	// initialisers.
	PendingInit func() (targets []*tf.Operation, ran func())
}

// GradientReducer combines the gradients of a step across replicas in
// place of strategy.CrossDeviceOps.BatchReduce(Sum): values[r][k] is the gradient of
// variable k on local replica r. The result stands for the sum of every
// replica's gradient, each on its replica's device.
type GradientReducer interface {
	ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error)
}

// Engine is the in-graph replication engine: one TensorFlow graph holds
// every local replica's copy of the step, pinned to its device, and one
// Session.Run executes a global step on all of them in parallel. The default
// strategy, Mirrored and MultiWorkerMirrored each embed an Engine, with
// different devices, sessions and CrossDeviceOps.
type Engine struct {
	cfg   Config
	log   *zap.Logger
	graph *tf.Graph
	sess  *tfrt.Session

	mu       ctxsync.Mutex // serialises graph building and step runs
	scoping  atomic.Bool   // a Scope function runs
	vars     []*variable
	byName   map[string]*variable
	scopes   map[string]int // namespace counters
	slots    map[slotKey]*variable
	reducers map[string]*hostReducer
	views    map[*variable]*shardView // under Sharding, the trained variables' shards
	accum    *accumState              // gradient accumulation, once a step accumulates
	shared   []int                    // per local replica, the one whose OnWrite copies it uses (see holder)
	closed   bool
	failed   error // a run error that wraps ErrCannotContinue
}

type slotKey struct {
	owner string
	v     *variable
	slot  string
}

// New checks cfg against the devices the session really has and
// returns an engine. An unknown device is an error that lists the devices
// that exist.
func New(cfg Config) (*Engine, error) {
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	so := cfg.Session
	if so == nil {
		so = &tf.SessionOptions{}
	}
	g := tf.NewGraph()
	sess, err := tfrt.NewSession(g, so)
	if err != nil {
		return nil, tfrt.Classify("strategy: open session", err)
	}
	have, err := sess.ListDevices()
	if err != nil {
		sess.Close()
		return nil, err
	}
	for i, d := range append(append([]string(nil), cfg.Devices...), cfg.HostDevice) {
		spec, err := tfrt.ParseDevice(d)
		if err != nil {
			sess.Close()
			return nil, fmt.Errorf("strategy: device %d: %w", i, err)
		}
		found := false
		for _, h := range have {
			if spec.Matches(h.Name) {
				found = true
				break
			}
		}
		if !found {
			names := make([]string, len(have))
			for j, h := range have {
				names[j] = h.Name
			}
			sess.Close()
			return nil, fmt.Errorf("strategy: unknown device %q; the devices that exist are %s", d, strings.Join(names, ", "))
		}
	}
	e := &Engine{
		cfg:      cfg,
		log:      logging.OrNop(cfg.Logger).With(zap.String("strategy", cfg.Name)),
		graph:    g,
		sess:     sess,
		byName:   map[string]*variable{},
		scopes:   map[string]int{},
		slots:    map[slotKey]*variable{},
		reducers: map[string]*hostReducer{},
		views:    map[*variable]*shardView{},
		shared:   firstOnDevice(cfg.Devices),
	}
	e.log.Debug("strategy ready", zap.Strings("devices", cfg.Devices), zap.Int("replicas_in_sync", cfg.NumReplicasInSync))
	return e, nil
}

// complete checks cfg and fills in its defaults; with VirtualShards, it
// expands Devices into the virtual shards' (see virtualize).
func (cfg *Config) complete() error {
	if len(cfg.Devices) == 0 {
		return errors.New("strategy: Config.Devices: empty, expected at least one device")
	}
	if cfg.CrossDeviceOps == nil {
		return errors.New("strategy: Config.CrossDeviceOps: nil")
	}
	if cfg.NumReplicasInSync == 0 {
		cfg.NumReplicasInSync = len(cfg.Devices)
	}
	if cfg.NumReplicasInSync < len(cfg.Devices) {
		return fmt.Errorf("strategy: Config.NumReplicasInSync: %d, expected at least the %d local devices",
			cfg.NumReplicasInSync, len(cfg.Devices))
	}
	cfg.NumWorkers = cmp.Or(cfg.NumWorkers, 1)
	cfg.Name = cmp.Or(cfg.Name, "in-graph")
	if cfg.HostDevice == "" {
		d, err := tfrt.ParseDevice(cfg.Devices[0])
		if err != nil {
			return fmt.Errorf("strategy: Config.Devices[0]: %w", err)
		}
		d.Type, d.Index = "CPU", 0
		cfg.HostDevice = d.String()
	}
	seen := map[string]bool{}
	for i, d := range cfg.Devices {
		if seen[d] {
			return fmt.Errorf("strategy: Config.Devices[%d]: %q appears twice; each replica needs its own device", i, d)
		}
		seen[d] = true
	}
	switch {
	case cfg.Sharding != nil && cfg.VirtualShards > 0:
		return errors.New("strategy: Config.Sharding with VirtualShards: sharded optimizer state does not sum in tree order")
	case cfg.Sharding != nil && cfg.IndependentSteps:
		return errors.New("strategy: Config.Sharding with IndependentSteps: independent steps reduce no gradient across workers to shard")
	case cfg.VirtualShards == 0:
		return nil
	}
	return cfg.virtualize()
}

// Devices returns the local replica devices.
func (e *Engine) Devices() []string { return append([]string(nil), e.cfg.Devices...) }

// NumReplicasInSync returns the number of replicas across all workers.
func (e *Engine) NumReplicasInSync() int { return e.cfg.NumReplicasInSync }

// NumLocalReplicas returns the number of replicas in this process.
func (e *Engine) NumLocalReplicas() int { return len(e.cfg.Devices) }

// namespace returns a fresh graph-building scope over the engine's graph
// with a namespace of its own (name, name_1, …). Each scope has its own
// error state, so a failed build does not poison later ones. e.mu is held.
func (e *Engine) namespace(name string) *op.Scope {
	s, _ := e.newScope(name)
	return s
}

// newScope is namespace that also returns the namespace.
func (e *Engine) newScope(name string) (*op.Scope, string) {
	n := e.scopes[name]
	e.scopes[name]++
	ns := name
	if n > 0 {
		ns = fmt.Sprintf("%s_%d", name, n)
	}
	return op.NewScopeWithGraph(e.graph).SubScope(ns), ns
}

// Scope runs fn with a Scope that creates variables the strategy's way.
// It builds ops only and never waits for peers: the next call that takes a
// context (a step's run, Value, a checkpoint's save or restore)
// initialises the new variables first, bounded by that context.
func (e *Engine) Scope(fn func(strategy.Scope) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("strategy: closed")
	}
	sc := &scope{g: e}
	e.scoping.Store(true)
	err := graphutil.Safely(func() error { return fn(sc) })
	e.scoping.Store(false)
	sc.closed = true
	return err
}

// Variables returns every variable of the strategy, in creation order.
func (e *Engine) Variables() []strategy.Variable {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]strategy.Variable, len(e.vars))
	for i, v := range e.vars {
		out[i] = v
	}
	return out
}

// TrainableVariables returns the trainable variables, in creation order.
func (e *Engine) TrainableVariables() []strategy.Variable {
	var out []strategy.Variable
	for _, v := range e.Variables() {
		if v.Trainable() {
			out = append(out, v)
		}
	}
	return out
}

// own returns v as a variable of e, or an error saying what it is.
func (e *Engine) own(v strategy.Variable, what string) (*variable, error) {
	iv, ok := v.(*variable)
	if !ok || iv == nil || iv.owner != e {
		return nil, fmt.Errorf("%s: variable %v was not created in this strategy's scope", what, v)
	}
	return iv, nil
}

func (e *Engine) newVariable(name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (*variable, error) {
	cfg, err := strategy.NewVariableConfig(name, shape, opts...)
	if err != nil {
		return nil, err
	}
	if err := e.nameFree(name); err != nil {
		return nil, err
	}
	if init == nil {
		return nil, fmt.Errorf("strategy: variable %q: nil initializer", name)
	}
	v := &variable{name: name, dtype: dtype, shape: append([]int64(nil), shape...), sync: cfg.Synchronization,
		agg: cfg.Aggregation, trainable: cfg.Trainable, owner: e}
	s := e.namespace("var/" + name)
	var assigns []*tf.Operation
	err = graphutil.Safely(func() error {
		val, err := init.Build(s.SubScope("initial_value").WithDevice(e.cfg.Devices[0]), dtype, shape)
		if err != nil {
			return err
		}
		vals := make([]tf.Output, len(e.cfg.Devices))
		for r := range vals {
			vals[r] = val
		}
		if b, ok := e.cfg.CrossDeviceOps.(Broadcaster); ok && e.cfg.NumReplicasInSync > len(e.cfg.Devices) {
			if vals, err = b.Broadcast(s.SubScope("broadcast"), val, e.cfg.Devices); err != nil {
				return err
			}
		}
		for r, dev := range e.cfg.Devices {
			if o := e.holder(v, r); o != r {
				v.handles = append(v.handles, v.handles[o])
				continue
			}
			rs := s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(dev)
			h := op.VarHandleOp(rs, dtype, tf.MakeShape(shape...),
				op.VarHandleOpSharedName(fmt.Sprintf("%s/replica_%d", name, e.cfg.FirstReplicaID+r)))
			v.handles = append(v.handles, h)
			assigns = append(assigns, op.AssignVariableOp(rs.SubScope("init"), h, vals[r]))
		}
		v.init = op.NoOp(s.SubScope("init").WithControlDependencies(assigns...))
		return s.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("strategy: variable %q: %w", name, err)
	}
	e.add(v)
	return v, nil
}

// nameFree returns an error unless no variable of e is named name.
func (e *Engine) nameFree(name string) error {
	if _, dup := e.byName[name]; dup {
		return fmt.Errorf("strategy: variable name %q: already used; names must be unique", name)
	}
	return nil
}

// add makes v, built, a variable of e.
func (e *Engine) add(v *variable) {
	e.vars = append(e.vars, v)
	e.byName[v.name] = v
}

// initPending initialises every variable not yet initialised or restored,
// and the state of Config.PendingInit.
func (e *Engine) initPending(ctx context.Context) error {
	var targets []*tf.Operation
	var pending []*variable
	for _, v := range e.vars {
		if !v.inited {
			targets = append(targets, v.init)
			pending = append(pending, v)
		}
	}
	ran := func() {}
	if e.cfg.PendingInit != nil {
		var more []*tf.Operation
		more, ran = e.cfg.PendingInit()
		targets = append(targets, more...)
	}
	if len(targets) == 0 {
		return nil
	}
	if _, err := e.runLocked(ctx, nil, nil, targets); err != nil {
		return fmt.Errorf("strategy: initialise variables: %w", err)
	}
	for _, v := range pending {
		v.inited = true
	}
	ran()
	return nil
}

// runLocked runs the engine's session, bounded by ctx: when ctx ends
// during the run, the run returns within about a second, wrapping
// ctx.Err(), and the engine refuses every later run (ErrCannotContinue),
// since the run may have stopped halfway (some replicas' updates applied,
// a collective half done). The end of ctx aborts the peers' collectives
// (AbortPeers), so that a run waiting in one returns, and interrupts the
// session (see tfrt.Session), which stops what TensorFlow can cancel: its
// own collectives and receives, and the runs of a distributed session.
func (e *Engine) runLocked(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error) {
	if e.closed {
		return nil, errors.New("strategy: closed")
	}
	if e.failed != nil {
		return nil, fmt.Errorf("strategy: not run, since an earlier run failed: %w", e.failed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	aborted := func() bool { return false }
	if e.cfg.AbortPeers != nil && ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			e.cfg.AbortPeers(fmt.Errorf("worker %d stopped its step: %w", e.cfg.WorkerID, context.Cause(ctx)))
		})
		defer stop()
		aborted = func() bool { return !stop() }
	}
	out, err := e.sess.Run(ctx, feeds, fetches, targets)
	if aborted() || errors.Is(err, tfrt.ErrInterrupted) {
		cause := ctx.Err()
		if cause == nil {
			cause = err
		}
		e.failed = fmt.Errorf("strategy: run stopped by its context: %w; %w", cause, strategy.ErrCannotContinue)
		e.log.Warn("the strategy cannot go on", zap.Error(e.failed))
		return nil, e.failed
	}
	if err != nil {
		err = tfrt.Classify("strategy: run", err)
		if e.cfg.DiagnoseRunError != nil {
			err = e.cfg.DiagnoseRunError(err)
		}
		if errors.Is(err, strategy.ErrCannotContinue) {
			e.failed = err
			e.log.Error("the strategy cannot go on", zap.Error(err))
		}
		return nil, err
	}
	return out, nil
}

// Value reads a variable outside any replica: the primary copy of an
// OnWrite variable, or the aggregate of an OnRead variable's copies (an
// error when its aggregation is None).
func (e *Engine) Value(ctx context.Context, vv strategy.Variable) (*tf.Tensor, error) {
	v, err := e.own(vv, "strategy: Value")
	if err != nil {
		return nil, err
	}
	if err := e.lock(ctx); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return nil, err
	}
	h, err := e.readerLocked(v)
	if err != nil {
		return nil, err
	}
	out, err := e.runLocked(ctx, nil, []tf.Output{h.out}, h.all)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// Values reads vs as Value does, in one run: one extension of the graph
// and one Session.Run for all of them, rather than one each.
func (e *Engine) Values(ctx context.Context, vs []strategy.Variable) ([]*tf.Tensor, error) {
	own := make([]*variable, len(vs))
	for i, vv := range vs {
		v, err := e.own(vv, "strategy: Values")
		if err != nil {
			return nil, err
		}
		own[i] = v
	}
	if err := e.lock(ctx); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return nil, err
	}
	fetches := make([]tf.Output, len(own))
	var targets []*tf.Operation
	for i, v := range own {
		h, err := e.readerLocked(v)
		if err != nil {
			return nil, err
		}
		fetches[i], targets = h.out, append(targets, h.all...)
	}
	if len(fetches) == 0 {
		return nil, nil
	}
	return e.runLocked(ctx, nil, fetches, targets)
}

// readerLocked returns v's reader outside replicas, built once per
// variable.
func (e *Engine) readerLocked(v *variable) (*hostReducer, error) {
	key := "read/" + v.name
	if h, ok := e.reducers[key]; ok {
		return h, nil
	}
	s := e.namespace("read/" + v.name)
	h := &hostReducer{}
	err := graphutil.Safely(func() (err error) {
		if h.out, h.all, err = e.aggregate(s, v); err != nil {
			return err
		}
		return s.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("strategy: read %q: %w", v.name, err)
	}
	e.reducers[key] = h
	return h, nil
}

func reduceOpOf(a strategy.Aggregation) strategy.ReduceOp {
	if a == strategy.AggregationMean {
		return strategy.Mean
	}
	return strategy.Sum
}

// lock locks the engine for a call bounded by ctx: a call that waits for
// another (a run blocked on a peer, say) gives up when ctx ends.
func (e *Engine) lock(ctx context.Context) error {
	if e.scoping.Load() {
		return fmt.Errorf("strategy: %w", strategy.ErrInScope)
	}
	if err := e.mu.LockContext(ctx); err != nil {
		return fmt.Errorf("strategy: waiting for another call of the strategy to end: %w", err)
	}
	return nil
}

// Err returns the error that ended the strategy (one that wraps
// ErrCannotContinue), or nil while it can run steps.
func (e *Engine) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failed
}

// Close releases the session. The strategy cannot be used afterwards.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return e.sess.Close()
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// HeldBytes returns the bytes this process holds of v: every copy on a
// local device (one a device under virtual shards), each of the whole
// variable or, for a slot of sharded optimizer state (multiworker.WithZeRO),
// of this worker's shard of it.
func (e *Engine) HeldBytes(vv strategy.Variable) (int64, error) {
	v, err := e.own(vv, "strategy: HeldBytes")
	if err != nil {
		return 0, err
	}
	n := elemBytes(v.dtype)
	for _, d := range v.localShape() {
		n *= d
	}
	copies := map[tf.Output]bool{}
	for _, h := range v.handles {
		copies[h] = true
	}
	return n * int64(len(copies)), nil
}

// Copies reads every local copy of v, in replica order: for checking that
// mirrored copies agree, or for inspecting an OnRead variable's parts.
// Under virtual shards, the shards of a device read its one copy of an
// OnWrite variable.
func (e *Engine) Copies(ctx context.Context, vv strategy.Variable) ([]*tf.Tensor, error) {
	v, err := e.own(vv, "strategy: Copies")
	if err != nil {
		return nil, err
	}
	if err := e.lock(ctx); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return nil, err
	}
	key := "copies/" + v.name
	h, ok := e.reducers[key]
	if !ok {
		s := e.namespace("copies/" + v.name)
		h = &hostReducer{}
		for r := range v.handles {
			o := op.ReadVariableOp(s.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(e.cfg.Devices[r]), v.handles[r], v.dtype)
			h.in = append(h.in, o)
		}
		if err := s.Err(); err != nil {
			return nil, err
		}
		e.reducers[key] = h
	}
	return e.runLocked(ctx, nil, h.in, nil)
}

// Assign writes value to every local copy of v outside any replica, as a
// tf.distribute program assigns a variable in cross-replica context: to
// reset a metric between epochs, say. An OnRead variable with
// AggregationSum gets value/replicas in each copy, so that its value is
// value. Under MultiWorkerMirrored every worker assigns its own copies, so
// every worker must assign the same value.
func (e *Engine) Assign(ctx context.Context, vv strategy.Variable, value *tf.Tensor) error {
	v, err := e.own(vv, "strategy: Assign")
	if err != nil {
		return err
	}
	if err := (strategy.TensorSpec{DType: v.dtype, Shape: v.shape}).Check(v.name, value); err != nil {
		return fmt.Errorf("strategy: Assign: %w", err)
	}
	if err := e.lock(ctx); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := e.initPending(ctx); err != nil {
		return err
	}
	key := "assign/" + v.name
	h, ok := e.reducers[key]
	if !ok {
		s := e.namespace("assign/" + v.name)
		h = &hostReducer{in: []tf.Output{op.Placeholder(s.SubScope("value").WithDevice(e.cfg.HostDevice), v.dtype,
			op.PlaceholderShape(tf.MakeShape(v.shape...)))}}
		if err := graphutil.Safely(func() error { h.all = e.writeCopies(s, v, h.in[0]); return nil }); err != nil {
			return fmt.Errorf("strategy: Assign %q: %w", v.name, err)
		}
		if err := s.Err(); err != nil {
			return fmt.Errorf("strategy: Assign %q: %w", v.name, err)
		}
		e.reducers[key] = h
	}
	_, err = e.runLocked(ctx, map[tf.Output]*tf.Tensor{h.in[0]: value}, nil, h.all)
	e.forgetMicroSteps()
	return err
}
