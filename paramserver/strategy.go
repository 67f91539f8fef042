package paramserver

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/ctxsync"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/strategy"
)

// Strategy is ParameterServerStrategy on the chief of a cluster: variables
// live on the ps tasks, steps run on the workers, and a Coordinator
// schedules them.
//
// The chief keeps one graph of its own: variable initialisation, reads,
// checkpoints. Each worker has a graph of its own too, holding that
// worker's copy of every built Function. Each distinct run of a graph is
// split once into one part per task it places ops on (the ps tasks, the
// chief or the worker), imported into that task's TensorFlow session and
// executed, round by round, by the graph's own task: the chief for its
// graph, the worker for its steps, which read from the ps tasks and send
// them their updates directly. All the graphs name the same variables: a
// VarHandleOp with the same shared_name on the same ps task is the same
// resource. A worker that dies takes nothing with it but its parts, which
// the chief gives it again when it is back.
//
// A Strategy is safe for concurrent use. Graph building (Scope, Build,
// checkpoints) is serialised; steps run concurrently, one per worker.
type Strategy struct {
	cfg     config
	log     *zap.Logger
	spec    cluster.ClusterSpec
	self    string         // the chief's task name
	host    string         // the chief's CPU:0
	ps      []string       // each ps task's CPU:0, by position
	psTasks []cluster.Task // by position
	workers []*workerGraph

	local   *partition.Host // the chief's own ops
	clients *taskClients    // of the ps and worker tasks
	runID   string          // names this strategy's plans on the tasks

	mu        ctxsync.Mutex
	g0        *tf.Graph
	s0        *planSession
	scopes    map[string]int
	vars      []*Variable
	byName    map[string]*Variable
	nextPS    int
	pending   []pendingInit
	slotParts map[slotKey]*slotPart
	slots     map[string]*slotVar // by logical name
	slotList  []*slotVar
	progress  tf.Output // g0 handle of the applied-steps counter
	progInit  *tf.Operation
	progRead  tf.Output
	readers   map[*Variable]tf.Output
	nfn       int
	coord     *Coordinator
	closed    bool

	nextClosure atomic.Int64
	scoping     atomic.Bool // a Scope function runs
}

// pendingInit is an initialiser of g0 not run yet.
type pendingInit struct {
	op     *tf.Operation
	done   func()
	inited func() bool // set by a restore
}

// slotVar is an optimizer's slot or non-slot variable as checkpoints see
// it: one logical tensor, in as many parts as the variable it serves.
type slotVar struct {
	name  string
	dtype tf.DataType
	full  []int64
	parts []*slotPart
}

// slotPart is one resource variable of a slotVar: beside one shard of the
// variable it serves.
type slotPart struct {
	name   string // as optimizers see it: after the shard's view name
	dtype  tf.DataType
	shape  []int64
	device string
	shared string
	offset int64
	rows   int64
	shards int
	h0     tf.Output // the chief's handle
	init   *tf.Operation
	inited bool
}

func (p *slotPart) sliceSpec(full []int64) string { return sliceSpec(full, p.offset, p.rows, p.shards) }

// New returns the strategy for the task r names (TF_CONFIG when r is nil).
//
// On the chief it waits (at most WithStartupTimeout) for every ps and
// worker task to answer, and checks that each ps task runs ops. On a ps or worker task it serves
// instead, as Serve does, until ctx is done, and then returns ErrNotChief:
// the same program runs on every task, and only the chief goes on to train.
//
// The cluster must have a chief, at least one worker and at least one ps
// task; otherwise the error wraps ErrBadCluster and names what is missing.
func New(ctx context.Context, r cluster.Resolver, opts ...Option) (*Strategy, error) {
	c := newConfig(opts)
	if r == nil {
		var err error
		if r, err = cluster.FromEnv(); err != nil {
			return nil, fmt.Errorf("paramserver: %w", err)
		}
	}
	spec := r.ClusterSpec()
	if err := checkCluster(spec); err != nil {
		return nil, err
	}
	task := cluster.TaskOf(r)
	switch task.Type {
	case cluster.PS, cluster.Worker:
		if err := Serve(ctx, r, opts...); err != nil {
			return nil, err
		}
		return nil, ErrNotChief
	case cluster.Chief:
	default:
		return nil, fmt.Errorf("%w: task %s: a parameter-server cluster runs its training from the chief; expected task type chief, worker or ps", ErrBadCluster, task)
	}
	log := logging.ForTask(c.log, string(task.Type), task.Index)
	s, err := newStrategy(spec, task, c, log)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, c.startupTimeout)
	defer cancel()
	start := time.Now()
	if err := s.waitForTasks(wctx); err != nil {
		s.release()
		return nil, err
	}
	if err := s.checkPS(ctx); err != nil {
		s.release()
		return nil, err
	}
	for i, wi := range spec.TaskIndices(cluster.Worker) {
		if err := s.addWorker(i, cluster.Task{Type: cluster.Worker, Index: wi}); err != nil {
			s.release()
			return nil, err
		}
	}
	if err := s.buildProgress(ctx); err != nil {
		s.release()
		return nil, err
	}
	log.Info("parameter-server strategy ready", zap.Int("workers", len(s.workers)),
		zap.Int("ps", len(s.ps)), zap.Duration("cluster_up_after", time.Since(start)))
	return s, nil
}

// newStrategy returns the chief's strategy: its own TensorFlow session,
// and a client of every ps and worker task.
func newStrategy(spec cluster.ClusterSpec, task cluster.Task, c config, log *zap.Logger) (*Strategy, error) {
	tlsCfg, err := c.security(log)
	if err != nil {
		return nil, err
	}
	so, err := c.hostOptions()
	if err != nil {
		return nil, err
	}
	local, err := partition.NewHost(so, partition.Interruptible())
	if err != nil {
		return nil, fmt.Errorf("paramserver: the chief's session: %w", err)
	}
	s := &Strategy{
		cfg: c, log: log, spec: spec, self: taskName(task), local: local, runID: "r" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12],
		host:   cluster.DeviceName(string(cluster.Chief), task.Index, "CPU", 0),
		scopes: map[string]int{}, byName: map[string]*Variable{},
		slotParts: map[slotKey]*slotPart{}, slots: map[string]*slotVar{}, readers: map[*Variable]tf.Output{},
		clients: &taskClients{clients: map[string]*taskserver.Client{}, addrs: map[string]string{}},
	}
	opts := append(taskOptions(spec, tlsCfg, log), taskserver.WithTimeout(c.opTimeout))
	for _, t := range spec.Tasks() {
		if t.Type != cluster.PS && t.Type != cluster.Worker {
			continue
		}
		addr, _ := spec.TaskAddress(t.Type, t.Index)
		s.clients.clients[taskName(t)] = taskserver.NewClient(addr, opts...)
		s.clients.addrs[taskName(t)] = addr
		if t.Type == cluster.PS {
			s.psTasks = append(s.psTasks, t)
			s.ps = append(s.ps, cluster.DeviceName(string(cluster.PS), t.Index, "CPU", 0))
		}
	}
	s.g0 = tf.NewGraph()
	s.s0 = &planSession{g: s.g0, prefix: s.runID + "_chief", self: s.self, local: local, tasks: s.clients, plans: map[string]*sessionPlan{}}
	return s, nil
}

// waitForTasks waits until every ps and worker task answers; the error of
// a wait that ctx ends is a *cluster.UnreachableError naming those that
// never did.
func (s *Strategy) waitForTasks(ctx context.Context) error {
	start := time.Now()
	pending := append(append([]cluster.Task(nil), s.psTasks...), s.workerTasks()...)
	var last error
	for {
		var still []cluster.Task
		for _, t := range pending {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := s.clients.clients[taskName(t)].Ping(pctx)
			cancel()
			if err != nil {
				last, still = err, append(still, t)
			}
		}
		if pending = still; len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			ue := &cluster.UnreachableError{Tasks: pending, Addrs: map[cluster.Task]string{}, Waited: time.Since(start),
				Err: fmt.Errorf("%w (the last answer: %v)", ctx.Err(), last)}
			for _, t := range pending {
				ue.Addrs[t] = s.clients.addrs[taskName(t)]
			}
			return fmt.Errorf("paramserver: %w", ue)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Strategy) workerTasks() []cluster.Task {
	var out []cluster.Task
	for _, i := range s.spec.TaskIndices(cluster.Worker) {
		out = append(out, cluster.Task{Type: cluster.Worker, Index: i})
	}
	return out
}

// addWorker adds the graph of the i-th worker, task t.
func (s *Strategy) addWorker(i int, t cluster.Task) error {
	name := taskName(t)
	w := &workerGraph{index: i, task: t, addr: s.clients.addrs[name],
		device: cluster.DeviceName(string(t.Type), t.Index, "CPU", 0),
		graph:  tf.NewGraph(), scopes: map[string]int{}, handles: map[resource]tf.Output{}}
	w.sess = &planSession{g: w.graph, prefix: fmt.Sprintf("%s_w%d", s.runID, i), self: name,
		exec: s.clients.clients[name], tasks: s.clients, plans: map[string]*sessionPlan{}}
	if err := w.buildBasics(s, s.spec.NumTasks(cluster.Worker)); err != nil {
		return err
	}
	s.workers = append(s.workers, w)
	return nil
}

// release lets go of the chief's session and clients.
func (s *Strategy) release() {
	s.clients.close()
	s.local.Close()
}

// checkPS runs an op on every ps task, so that a ps that accepts
// connections but does not serve TensorFlow is found now.
func (s *Strategy) checkPS(ctx context.Context) error {
	sc := s.newScope0("check_ps")
	var fetches []tf.Output
	for k, dev := range s.ps {
		fetches = append(fetches, op.Const(sc.SubScope(fmt.Sprintf("ps_%d", k)).WithDevice(dev), int32(k)))
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if _, err := s.run0(ctx, nil, fetches, nil); err != nil {
		return fmt.Errorf("paramserver: the ps tasks %v do not run ops: %w", s.psTasks, err)
	}
	return nil
}

// buildProgress creates the counter of applied steps on ps 0: element 0
// counts the steps whose update was applied, element 1+w holds the id of the
// last step worker w applied (see Function).
func (s *Strategy) buildProgress(ctx context.Context) error {
	sc := s.newScope0("progress")
	n := int64(1 + len(s.workers))
	s.progress = op.VarHandleOp(sc.WithDevice(s.ps[0]), tf.Int64, tf.MakeShape(n), op.VarHandleOpSharedName(progressName))
	s.progInit = op.AssignVariableOp(sc.SubScope("init").WithDevice(s.ps[0]), s.progress,
		op.Const(sc.SubScope("zeros").WithDevice(s.host), make([]int64, n)))
	if err := sc.Err(); err != nil {
		return err
	}
	if _, err := s.run0(ctx, nil, nil, []*tf.Operation{s.progInit}); err != nil {
		return fmt.Errorf("paramserver: create the step counter on %s: %w", s.psTasks[0], err)
	}
	return nil
}

const progressName = "_paramserver/progress"

// newScope0 returns a fresh scope over the chief's graph in a namespace of
// its own.
func (s *Strategy) newScope0(name string) *op.Scope { return newScope(s.g0, s.scopes, name) }

func newScope(g *tf.Graph, counters map[string]int, name string) *op.Scope {
	n := counters[name]
	counters[name]++
	if n > 0 {
		name = fmt.Sprintf("%s_%d", name, n)
	}
	return op.NewScopeWithGraph(g).SubScope(name)
}

// run0 runs ops of the chief's graph, bounded by ctx. A run that ctx ends
// (a ps task that is stopped, say) may have written some of its variables
// (part of a restore, say). s.mu is held, or New runs.
func (s *Strategy) run0(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error) {
	out, err := s.s0.Run(ctx, feeds, fetches, targets)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("paramserver: run on the chief: %w", err)
	case err != nil:
		return nil, s.diagnose(fmt.Errorf("paramserver: run on the chief: %w", err))
	}
	return out, nil
}

// diagnose turns an error that a dead or restarted ps task caused into a
// *PSFailureError.
func (s *Strategy) diagnose(err error) error {
	if err == nil {
		return nil
	}
	if k, cause := s.psFailure(context.Background(), err); k >= 0 {
		addr, _ := s.spec.TaskAddress(cluster.PS, s.psTasks[k].Index)
		return &PSFailureError{Task: s.psTasks[k], Addr: addr, Err: cause}
	}
	return err
}

// Scope runs fn with a Scope that creates variables on the ps tasks, then
// initialises them.
func (s *Strategy) Scope(fn func(strategy.Scope) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	sc := &scope{s: s}
	s.scoping.Store(true)
	err := graphutil.Safely(func() error { return fn(sc) })
	s.scoping.Store(false)
	sc.closed = true
	if err != nil {
		return err
	}
	return s.initPending()
}

// initPending runs the initialisers not run yet, within the operation
// timeout: Scope and Build, which run it, take no context. s.mu is held.
func (s *Strategy) initPending() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.opTimeout)
	defer cancel()
	var targets []*tf.Operation
	for _, p := range s.pending {
		if !p.inited() {
			targets = append(targets, p.op)
		}
	}
	if len(targets) == 0 {
		s.pending = nil
		return nil
	}
	if _, err := s.run0(ctx, nil, nil, targets); err != nil {
		return fmt.Errorf("paramserver: initialise variables: %w", err)
	}
	for _, p := range s.pending {
		p.done()
	}
	s.pending = nil
	return nil
}

// Variables returns the strategy's variables in creation order (not the
// optimizers' slots).
func (s *Strategy) Variables() []strategy.Variable {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]strategy.Variable, len(s.vars))
	for i, v := range s.vars {
		out[i] = v
	}
	return out
}

// NumWorkers returns the number of worker tasks.
func (s *Strategy) NumWorkers() int { return len(s.workers) }

// NumPS returns the number of ps tasks.
func (s *Strategy) NumPS() int { return len(s.ps) }

// ClusterSpec returns the cluster.
func (s *Strategy) ClusterSpec() cluster.ClusterSpec { return s.spec }

// Value reads the whole variable v on the chief, its shards concatenated.
func (s *Strategy) Value(ctx context.Context, vv strategy.Variable) (*tf.Tensor, error) {
	v, err := s.own(vv, "paramserver: Value")
	if err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if out, ok := s.readers[v]; ok {
		return s.fetch0(ctx, out, "Value "+strconv.Quote(v.name))
	}
	sc := s.newScope0("value/" + v.name)
	var out tf.Output
	err = graphutil.Safely(func() error {
		parts := make([]tf.Output, len(v.shards))
		for k, sh := range v.shards {
			parts[k] = op.ReadVariableOp(sc.SubScope(fmt.Sprintf("read_%d", k)).WithDevice(sh.device), sh.h0, v.dtype)
		}
		out = parts[0]
		if len(parts) > 1 {
			hs := sc.SubScope("concat").WithDevice(s.host)
			out = op.ConcatV2(hs, parts, op.Const(hs.SubScope("axis"), int32(0)))
		}
		return sc.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("paramserver: Value %q: %w", v.name, err)
	}
	s.readers[v] = out
	return s.fetch0(ctx, out, "Value "+strconv.Quote(v.name))
}

// lock locks the strategy for a call bounded by ctx: a call that waits for
// another (a run blocked on a ps task, say) gives up when ctx ends.
func (s *Strategy) lock(ctx context.Context) error {
	if s.scoping.Load() {
		return fmt.Errorf("paramserver: %w", strategy.ErrInScope)
	}
	if err := s.mu.LockContext(ctx); err != nil {
		return fmt.Errorf("paramserver: waiting for another call of the strategy to end: %w", err)
	}
	return nil
}

// own returns v as a variable of s, or an error saying what it is.
func (s *Strategy) own(v strategy.Variable, what string) (*Variable, error) {
	pv, ok := v.(*Variable)
	if !ok || pv == nil || pv.s != s {
		return nil, fmt.Errorf("%s: variable %v was not created in this strategy's scope", what, v)
	}
	return pv, nil
}

// fetch0 runs out in the chief's session. s.mu is held.
func (s *Strategy) fetch0(ctx context.Context, out tf.Output, what string) (*tf.Tensor, error) {
	res, err := s.run0(ctx, nil, []tf.Output{out}, nil)
	if err != nil {
		return nil, fmt.Errorf("paramserver: %s: %w", what, err)
	}
	return res[0], nil
}

// AppliedSteps returns how many scheduled steps have applied their updates
// to the variables: the count the ps tasks keep, which a step increments in
// the same operation that records it as applied. A step retried after its
// worker died is counted once.
func (s *Strategy) AppliedSteps(ctx context.Context) (int64, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if s.progRead.Op == nil {
		sc := s.newScope0("applied_steps")
		s.progRead = op.ReadVariableOp(sc.WithDevice(s.ps[0]), s.progress, tf.Int64)
		if err := sc.Err(); err != nil {
			return 0, err
		}
	}
	out, err := s.fetch0(ctx, s.progRead, "AppliedSteps")
	if err != nil {
		return 0, err
	}
	return tensorutil.Value(out).([]int64)[0], nil
}

// Close ends the coordinator, if one runs, and closes the chief's session
// and connections. The ps and worker tasks keep serving, and the ps tasks
// keep the variables, until their jobs end.
func (s *Strategy) Close() error {
	s.mu.Lock()
	c := s.coord
	s.mu.Unlock()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.opTimeout)
		c.shutdown(ctx)
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.release()
	return nil
}
