// Package multiworker is MultiWorkerMirroredStrategy: synchronous data
// parallelism across machines. Every worker runs the same program, reads its
// TF_CONFIG and builds the same graph for its local devices (between-graph
// replication). Gradients are summed across every replica of every worker,
// so all copies of every variable stay identical: by default with tfdist's
// own collective engine (package collective), whose async ops in the step's
// graph hand buffers to a group of TCP connections between the workers; or,
// with WithCommunication, by TensorFlow's collective ops over the worker's
// in-process TensorFlow server (ring all-reduce over gRPC, or NCCL on GPUs).
//
// Each worker runs one replica on each of its GPUs, else one on its CPU
// (WithDevices and WithLogicalCPUs choose others); every worker must have
// as many. On tfdist's engine a worker sums its replicas' values first
// (with NCCL on GPUs), and that one sum per tensor or pack crosses the
// workers. The GPU paths are untested: no machine that tests tfdist has a
// GPU.
//
// With no TF_CONFIG, or one that names a single worker, it runs like the
// Mirrored strategy on the local devices.
//
// The chief (the chief task, or worker 0 without one) writes checkpoints and
// summaries; see IsChief. Workers must build their steps and call Reduce,
// Gather and Value in the same order, since those are collectives.
package multiworker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/internal/voting"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// Strategy is MultiWorkerMirroredStrategy: tfdist's in-graph engine (one
// graph holds every local replica's copy of a step) whose CrossDeviceOps
// are collectives spanning the cluster. Its methods are those of the
// strategy.Strategy interface, plus State for checkpoints, RunReplicas (a
// step on per-replica inputs), the engine's cross-replica reads and writes
// (Values, Copies, Assign, Err) and the worker's place in the cluster.
type Strategy struct {
	*engine
	resolver cluster.Resolver
	task     cluster.Task
	workerID int
	workers  []cluster.Task
	// On TensorFlow's collectives: this task's server, its ops and the
	// session options of the handshake and the closing barrier.
	server   *tfrt.Server
	ring     *ringOps
	sessOpts []tfrt.ConfigOption
	log      *zap.Logger

	// On tfdist's engine: the group and its registration with the
	// collective ops.
	group      *collective.Group
	unregister func()
	// With WithAggregation: the rule's state; with TopK: the residuals.
	voter     *voting.Voter
	residuals *residuals
	// closeTimeout bounds Close's barrier.
	closeTimeout time.Duration
	// obs records the worker's steps and collectives.
	obs *observer

	// In an elastic job (RunElastic): the membership and the state.
	elastic *elasticRun
	// With WithLocalSGD: the synchronisation.
	localSGD *localSGD

	closeOnce sync.Once
	closeErr  error
}

type config struct {
	resolver       cluster.Resolver
	devices        []string
	logicalCPUs    int
	comm           Communication
	bytesPerPack   int64
	timeout        time.Duration
	startupTimeout time.Duration
	intra, inter   int      // WithThreads's; 0: not given
	pools          struct { // what New resolved of TensorFlow's thread pools
		intra, inter int
		noSpinning   bool // on tfdist's engine, whose goroutines need the cores idle threads would spin on
	}
	tls         *tls.Config
	requireTLS  bool
	aggregation aggregate.Rule
	compression Compression
	tcpOnly     bool
	log         *zap.Logger
	timeline    *timeline.Recorder
	metrics     *monitoring.Metrics
	shards      int // WithDeterministic's virtual shards, 0 without
	zero        int // WithZeRO's stage, 0 without
	localSGD    *LocalSGD
	// In an elastic job: the group's listener, membership epoch,
	// members' names, in rank order, and the rank of the member that
	// holds the job's state.
	listener net.Listener
	epoch    uint32
	names    []string
	holder   int
}

// closeTimeout bounds Close's barrier: as long as New waits for the
// workers to join, since a chief may still write a last checkpoint while
// the others wait for it.
func (c config) closeTimeout() time.Duration { return c.startupTimeout }

// Option configures New.
type Option func(*config)

// WithResolver takes the cluster from r instead of TF_CONFIG.
func WithResolver(r cluster.Resolver) Option { return func(c *config) { c.resolver = r } }

// WithDevices runs one replica on each named device of the worker
// ("/gpu:0", "/device:CPU:1", or full names) instead of the default: every
// GPU the worker's TensorFlow sees, else one CPU replica. Every worker must
// have the same number of replicas.
func WithDevices(devices ...string) Option {
	return func(c *config) { c.devices = append([]string(nil), devices...) }
}

// WithLogicalCPUs splits the worker's CPU into n logical devices and, unless
// WithDevices names others, runs one replica on each: how tfdist tests
// several devices per worker without GPUs. Every worker must have the same
// number of replicas.
func WithLogicalCPUs(n int) Option { return func(c *config) { c.logicalCPUs = n } }

// Communication chooses who moves tensors between workers (see
// WithCommunication).
type Communication int

const (
	// Auto is tfdist's own engine, the default: a worker sums its
	// replicas' values onto its host (with NCCL on GPUs), the engine
	// all-reduces that one sum per tensor or pack across workers, and the
	// result goes back to every replica.
	Auto Communication = iota
	// Ring is TensorFlow's ring all-reduce over gRPC (CPU and GPU).
	Ring
	// NCCL is NVIDIA's NCCL; every device must be a GPU. Untested: no
	// machine that tests tfdist has a GPU.
	NCCL
	// Engine is tfdist's own collective engine (package collective): tfdist's
	// ops in the step's graph hand their buffers to it, and it moves them
	// between worker processes over its own connections.
	Engine
)

// String returns the communication hint TensorFlow's collective ops take
// ("tfdist" for the engine, which they never see).
func (c Communication) String() string {
	switch c {
	case Ring:
		return "ring"
	case NCCL:
		return "nccl"
	case Engine:
		return "tfdist"
	}
	return "auto"
}

// WithCommunication chooses who moves tensors between workers: tfdist's
// engine (Auto, the default, or Engine), or TensorFlow's collectives (Ring,
// or NCCL, untested: no machine that tests tfdist has a GPU).
func WithCommunication(comm Communication) Option { return func(c *config) { c.comm = comm } }

// WithBytesPerPack packs gradients into buffers of up to n bytes before the
// all-reduce (default 32 MiB; 0 turns packing off). On tfdist's engine a
// gradient of 1 MiB or more goes alone: copying it into a pack and out
// again would cost more than its own all-reduce's fixed cost.
func WithBytesPerPack(n int64) Option { return func(c *config) { c.bytesPerPack = n } }

// WithCollectiveTimeout bounds how long a step waits for its peers: when a
// peer dies or stops responding, the survivors' step fails within d with an
// error naming the task, and the strategy then refuses further steps
// (strategy.ErrCannotContinue). On tfdist's engine, d bounds each
// collective operation's wait for its peers (a Go timer; a peer's death is
// seen at once). On TensorFlow's collectives it is each run's deadline (the
// session's operation timeout), which covers a whole step, so d must exceed
// the slowest step's compute time plus the time peers may lag (a chief's
// checkpoint, say). Default 60 s; 0 waits forever, and New logs a warning;
// a negative d is an error.
func WithCollectiveTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithSharedMemory sets whether tfdist's engine moves tensors between
// workers on one host through shared memory (on by default, Linux): each
// connection is set up and authenticated over TCP, and TLS when it is on,
// then both workers agree to move their frames to a segment only they
// map. Workers on other hosts, or in other network namespaces (other
// containers), stay on TCP. Off, every worker's traffic goes over TCP.
// TensorFlow's collectives ignore it.
func WithSharedMemory(on bool) Option { return func(c *config) { c.tcpOnly = !on } }

// WithStartupTimeout bounds how long New waits for every worker to join
// (default 120 s).
func WithStartupTimeout(d time.Duration) Option { return func(c *config) { c.startupTimeout = d } }

// WithThreads sets TensorFlow's intra-op and inter-op thread pool sizes;
// a size of 0 is TF_NUM_INTRAOP_THREADS or TF_NUM_INTEROP_THREADS where
// the environment sets them, else the cores the process may use (at least
// 2 inter-op threads). TensorFlow sizes its pools once per process, at its
// first session: in a process that opened one before New, they stay as it
// set them. Without an inter-op size, a worker with one device on tfdist's engine
// runs each step's ops on the thread that calls Run, which saves thread
// hand-offs in every step; with one, on the inter-op pool.
func WithThreads(intraOp, interOp int) Option {
	return func(c *config) { c.intra, c.inter = intraOp, interOp }
}

// WithLogger sets the logger; log lines carry the task type and index.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// New joins this task to its workers, on tfdist's engine (listening on the
// task's port) or on TensorFlow's collectives (starting the task's
// TensorFlow server), waits for every worker to join and checks that all of
// them were given the same cluster. TF_CONFIG names a chief or worker task;
// ps and evaluator tasks are an error.
func New(ctx context.Context, opts ...Option) (*Strategy, error) {
	c := config{bytesPerPack: 32 << 20, timeout: 60 * time.Second, startupTimeout: 120 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.resolver == nil {
		r, err := cluster.FromEnv()
		if err != nil {
			return nil, fmt.Errorf("multiworker: %w", err)
		}
		c.resolver = r
	}
	if c.logicalCPUs < 0 {
		return nil, fmt.Errorf("multiworker: WithLogicalCPUs(%d): expected a positive count", c.logicalCPUs)
	}
	if c.timeout < 0 {
		return nil, fmt.Errorf("multiworker: WithCollectiveTimeout(%v): expected a positive duration, or 0 to wait forever", c.timeout)
	}
	if c.startupTimeout <= 0 {
		return nil, fmt.Errorf("multiworker: WithStartupTimeout(%v): expected a positive duration", c.startupTimeout)
	}
	if err := c.checkDeterministic(); err != nil {
		return nil, err
	}
	if err := c.checkLocalSGD(); err != nil {
		return nil, err
	}
	if err := c.checkZeRO(); err != nil {
		return nil, err
	}
	var err error
	if c.pools.intra, c.pools.inter, err = tfrt.ResolveThreads(c.intra, c.inter); err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	spec := c.resolver.ClusterSpec()
	task := cluster.TaskOf(c.resolver)
	log := logging.OrNop(c.log)
	if spec.IsEmpty() || spec.WorkerCount() <= 1 && spec.NumTasks(cluster.PS) == 0 {
		if err := c.checkGradients(1); err != nil {
			return nil, err
		}
		if c.zero > 0 {
			return nil, fmt.Errorf("multiworker: WithZeRO(%d) on one worker: the optimizer state is sharded across workers; run two or more (tfdist launch --workers N), or drop WithZeRO", c.zero)
		}
		return observed(c, task, func(obs *observer) (*Strategy, error) { return newLocal(c, task, log) })
	}
	if task.Type != cluster.Chief && task.Type != cluster.Worker {
		return nil, fmt.Errorf("multiworker: task %s: MultiWorkerMirrored runs on chief and worker tasks; expected TF_CONFIG task.type chief or worker", task)
	}
	if spec.NumTasks(cluster.PS) > 0 {
		return nil, fmt.Errorf("multiworker: the cluster has ps tasks; MultiWorkerMirrored takes chief and worker tasks only (use the paramserver strategy)")
	}
	workers := workerTasks(spec)
	workerID := -1
	for i, w := range workers {
		if w == task {
			workerID = i
		}
	}
	if workerID < 0 {
		return nil, fmt.Errorf("multiworker: task %s is not in the cluster", task)
	}
	if err := c.checkGradients(len(workers)); err != nil {
		return nil, err
	}
	log = logging.ForTask(log, string(task.Type), task.Index)
	if c.timeout == 0 {
		log.Warn("collective timeout 0: a step waits forever for its peers, so a dead or stopped peer hangs this worker")
	}

	onEngine := c.comm == Engine || c.comm == Auto
	c.pools.noSpinning = onEngine
	devices, err := c.localDevices(task)
	if err != nil {
		return nil, err
	}
	return observed(c, task, func(obs *observer) (*Strategy, error) {
		w := joined{spec: spec, task: task, workers: workers, workerID: workerID, devices: devices, log: log, obs: obs}
		if onEngine {
			return newOnEngine(ctx, c, w)
		}
		if err := c.checkPlaintext(log); err != nil {
			return nil, err
		}
		return newOnServer(ctx, c, w)
	})
}

// observed sets up the worker's observer, then the strategy with newS.
func observed(c config, task cluster.Task, newS func(*observer) (*Strategy, error)) (*Strategy, error) {
	obs, err := newObserver(c, task.String())
	if err != nil {
		return nil, err
	}
	s, err := newS(obs)
	if err != nil {
		return nil, errors.Join(err, obs.close())
	}
	s.obs = obs
	return s, nil
}

// joined is what New learnt of this worker's place in the cluster.
type joined struct {
	spec     cluster.ClusterSpec
	task     cluster.Task
	workers  []cluster.Task
	workerID int
	devices  []string // the local replicas', as the in-process session names them
	log      *zap.Logger
	obs      *observer
}

// nLocal is the number of local replicas.
func (w joined) nLocal() int { return len(w.devices) }

// localDevices chooses this worker's replica devices (see WithDevices),
// named as an in-process session names them, and checks that NCCL, when
// asked for, has GPUs.
func (c config) localDevices(task cluster.Task) ([]string, error) {
	available, err := tfrt.LocalDevices(c.sessionBase()...)
	if err != nil {
		return nil, fmt.Errorf("multiworker: task %s: list devices: %w", task, err)
	}
	return c.chooseDevices(available, task)
}

// chooseDevices chooses the replicas' devices among available.
func (c config) chooseDevices(available []tfrt.Device, task cluster.Task) ([]string, error) {
	devices, err := tfrt.ReplicaDevices(available, c.devices, c.logicalCPUs)
	if err != nil {
		return nil, fmt.Errorf("multiworker: task %s: %w", task, err)
	}
	if c.comm == NCCL {
		if err := ingraph.RequireGPUs(devices); err != nil {
			return nil, fmt.Errorf("multiworker: task %s: WithCommunication(NCCL): %w", task, err)
		}
	}
	return devices, nil
}

// sessionBase is every session's thread pools (resolved by New) and
// WithLogicalCPUs's devices. TensorFlow sizes and sets up its pools once
// per process, at its first session, so the first (listing the devices)
// has them too.
func (c config) sessionBase() []tfrt.ConfigOption {
	opts := []tfrt.ConfigOption{tfrt.WithThreads(c.pools.intra, c.pools.inter)}
	if c.pools.noSpinning {
		opts = append(opts, tfrt.WithoutThreadSpinning())
	}
	if c.logicalCPUs > 0 {
		opts = append(opts, tfrt.WithLogicalCPUs(c.logicalCPUs))
	}
	return opts
}

// sessionOptions are the session's thread pools and logical CPUs.
func (w joined) sessionOptions(c config, more ...tfrt.ConfigOption) []tfrt.ConfigOption {
	return append(c.sessionBase(), more...)
}

// newOnServer runs the collectives on TensorFlow's: this task starts its
// TensorFlow server, and every step runs through it.
func newOnServer(ctx context.Context, c config, w joined) (*Strategy, error) {
	spec, task, workers, workerID, nLocal, log := w.spec, w.task, w.workers, w.workerID, w.nLocal(), w.log
	leader := cluster.TaskDevice(string(workers[0].Type), workers[0].Index)
	sessOpts := w.sessionOptions(c,
		tfrt.WithCollectiveGroupLeader(leader),
		tfrt.WithDeviceFilters(fmt.Sprintf("/job:%s/task:%d", task.Type, task.Index)))
	// An evaluator evaluates on the side; training tasks do not talk to it.
	def, err := spec.SplitEvaluator(task.Type).ServerDef(task.Type, task.Index, tfrt.NewConfig(sessOpts...))
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	srv, err := tfrt.NewServer(def)
	if err != nil {
		return nil, fmt.Errorf("multiworker: task %s: %w", task, err)
	}
	if err := srv.Start(); err != nil {
		srv.Close()
		return nil, fmt.Errorf("multiworker: task %s: %w", task, err)
	}
	log.Info("server started", zap.String("target", srv.Target()), zap.Int("workers", len(workers)), zap.Int("local_replicas", nLocal))

	devices := onTask(w.devices, task)
	ring := &ringOps{GroupSize: nLocal * len(workers), GroupKey: 1, FirstReplica: workerID * nLocal,
		Communication: c.comm}
	var cross strategy.CrossDeviceOps = ring
	if c.bytesPerPack > 0 {
		cross = ingraph.Packed{Inner: ring, BytesPerPack: c.bytesPerPack}
	}
	so, err := tfrt.SessionOptions(srv.Target(), append(slices.Clip(sessOpts), tfrt.WithOperationTimeout(c.timeout))...)
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	s := &Strategy{resolver: c.resolver, task: task, workerID: workerID, workers: workers, server: srv, log: log}
	e, err := ingraph.New(ingraph.Config{
		Name:              "multiworker",
		Devices:           devices,
		HostDevice:        onTask([]string{strategy.LocalCPU(0)}, task)[0],
		NumReplicasInSync: nLocal * len(workers),
		FirstReplicaID:    workerID * nLocal,
		NumWorkers:        len(workers),
		WorkerID:          workerID,
		CrossDeviceOps:    cross,
		Session:           so,
		Logger:            log,
		DiagnoseRunError:  s.diagnose,
	})
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	s.engine = e
	s.ring, s.sessOpts, s.closeTimeout = ring, sessOpts, c.closeTimeout()
	if err := s.handshake(ctx, spec, c.startupTimeout); err != nil {
		e.Close()
		srv.Close()
		return nil, err
	}
	log.Info("all workers joined", zap.Int("replicas_in_sync", e.NumReplicasInSync()))
	return s, nil
}

// newLocal is the single-worker case: collectives among the local devices
// of an in-process session.
func newLocal(c config, task cluster.Task, log *zap.Logger) (*Strategy, error) {
	devices, err := c.localDevices(task)
	if err != nil {
		return nil, err
	}
	n := len(devices)
	var cross strategy.CrossDeviceOps = &ringOps{GroupSize: n, GroupKey: 1, Communication: c.comm}
	if c.shards > 0 {
		cross = ingraph.ReductionToOneDevice{Device: strategy.LocalCPU(0), InTreeOrder: true}
	}
	if c.bytesPerPack > 0 && (n > 1 || c.shards > 1) {
		cross = ingraph.Packed{Inner: cross, BytesPerPack: c.bytesPerPack}
	}
	so, err := tfrt.SessionOptions("", c.sessionBase()...)
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	e, err := ingraph.New(ingraph.Config{
		Name: "multiworker", Devices: devices, CrossDeviceOps: cross, Logger: log, Session: so, VirtualShards: c.shards,
	})
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	s := &Strategy{engine: e, resolver: c.resolver, task: task, workers: []cluster.Task{task}, log: log}
	if c.localSGD != nil {
		s.localSGD = &localSGD{cfg: *c.localSGD, workers: 1}
	}
	return s, nil
}

// onTask renames local devices (as an in-process session names them) as
// task's devices on its TensorFlow server.
func onTask(local []string, task cluster.Task) []string {
	out := make([]string, len(local))
	for i, d := range local {
		spec, _ := tfrt.ParseDevice(d) // names TensorFlow gave, which parse
		spec.Job, spec.Replica, spec.Task = string(task.Type), 0, task.Index
		out[i] = spec.String()
	}
	return out
}

// workerTasks orders the tasks that train: the chief first, then workers.
func workerTasks(spec cluster.ClusterSpec) []cluster.Task {
	var out []cluster.Task
	for _, i := range spec.TaskIndices(cluster.Chief) {
		out = append(out, cluster.Task{Type: cluster.Chief, Index: i})
	}
	for _, i := range spec.TaskIndices(cluster.Worker) {
		out = append(out, cluster.Task{Type: cluster.Worker, Index: i})
	}
	return out
}

// handshake gathers every worker's view of the cluster (its fingerprint)
// within timeout and names the tasks that disagree, or that never joined.
// It is every worker's first collective, so its instance key agrees.
func (s *Strategy) handshake(ctx context.Context, spec cluster.ClusterSpec, timeout time.Duration) error {
	fp := spec.Fingerprint()
	all, err := s.round(ctx, "handshake", int64(fp), timeout)
	if err != nil {
		return fmt.Errorf("multiworker: task %s: waiting %v for every worker to join: %w", s.task, timeout, err)
	}
	got := map[cluster.Task]cluster.Fingerprint{}
	for w, task := range s.workers {
		got[task] = cluster.Fingerprint(all[w])
	}
	if err := cluster.CheckFingerprints(fp, got); err != nil {
		return fmt.Errorf("multiworker: task %s: %w", s.task, err)
	}
	all, err = s.round(ctx, "replica_counts", int64(s.NumLocalReplicas()), timeout)
	if err != nil {
		return fmt.Errorf("multiworker: task %s: gather the workers' replica counts: %w", s.task, err)
	}
	counts := make([]int, len(all))
	for i, n := range all {
		counts[i] = int(n)
	}
	return sameReplicaCounts(s.task, s.Devices(), s.workers, counts)
}

// sameReplicaCounts refuses a cluster whose workers have different
// numbers of replicas (counts[w] is worker w's): each worker's replicas
// are a fixed share of the global batch and of NumReplicasInSync.
func sameReplicaCounts(task cluster.Task, devices []string, workers []cluster.Task, counts []int) error {
	for w, n := range counts {
		if n != len(devices) {
			return fmt.Errorf("multiworker: task %s has %d replicas (%s) and task %s has %d; every worker needs the same number (WithDevices, WithLogicalCPUs, or the GPUs each worker sees)",
				task, len(devices), strings.Join(devices, ", "), workers[w], n)
		}
	}
	return nil
}

// roundGroupKey is the TensorFlow collective group of the rounds: each
// worker's host CPU, one member per worker whatever its replicas, so that
// workers with different numbers of replicas can still find it out.
const roundGroupKey = 2

// round all-gathers one value from every worker on TensorFlow's
// collectives and returns worker w's at index w. It runs in a graph and
// session of its own, whose deadline is timeout rather than the steps'
// collective timeout; its instance key comes next in build order, so every
// worker must hold its rounds at the same point of the program.
func (s *Strategy) round(ctx context.Context, label string, value int64, timeout time.Duration) ([]int64, error) {
	hs := &ringOps{GroupSize: len(s.workers), GroupKey: roundGroupKey, FirstReplica: s.workerID, Communication: Ring}
	hs.next = s.ring.instanceKey() - 1
	g := tf.NewGraph()
	sc := op.NewScopeWithGraph(g).SubScope(label)
	host := onTask([]string{strategy.LocalCPU(0)}, s.task)
	vals := [][]tf.Output{{op.Const(sc.SubScope("value").WithDevice(host[0]), []int64{value})}}
	out, err := hs.BatchGather(sc.SubScope("gather"), vals, host)
	if err != nil {
		return nil, fmt.Errorf("build the %s: %w", label, err)
	}
	so, err := tfrt.SessionOptions(s.server.Target(), append(slices.Clip(s.sessOpts), tfrt.WithOperationTimeout(timeout))...)
	if err != nil {
		return nil, err
	}
	targets := []*tf.Operation{out[0][0].Op}
	// TensorFlow ends the run at timeout; the context's deadline, later,
	// is a safety net.
	rctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	t, err := runOnce(rctx, g, so, []tf.Output{out[0][0]}, targets)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, fmt.Errorf("%s: %w", label, ctx.Err())
	case rctx.Err() != nil:
		return nil, fmt.Errorf("not every worker joined the %s within %v; %s", label, timeout, s.unreachable(label == "handshake"))
	default:
		err = tfrt.Classify("run the "+label, err)
		if u := s.unreachable(label == "handshake"); u != "" {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		return nil, err
	}
	return tensorutil.Value(t[0]).([]int64), nil
}

// Task returns this process's task.
func (s *Strategy) Task() cluster.Task { return s.task }

// WorkerID returns this worker's index among the workers (the chief is 0).
func (s *Strategy) WorkerID() int { return s.workerID }

// NumWorkers returns the number of workers (chief included).
func (s *Strategy) NumWorkers() int { return len(s.workers) }

// IsChief reports whether this task is the chief: it writes checkpoints and
// summaries; the others write to temporary locations.
func (s *Strategy) IsChief() bool {
	if s.resolver == nil || s.resolver.ClusterSpec().IsEmpty() {
		return true
	}
	return cluster.IsChief(s.resolver)
}

// CollectiveStats returns the collective operations this worker has
// started on tfdist's engine (every all-reduce, all-gather and broadcast
// that the steps, Reduce and Gather ran, and the variables' initial
// broadcasts): for monitoring, and to check that a step communicates as
// much as expected. With WithCommunication(Ring) it returns zeros.
func (s *Strategy) CollectiveStats() collective.Stats {
	if s.group == nil {
		return collective.Stats{}
	}
	return s.group.Stats()
}

// Close releases the session, tells the peers that this worker has
// finished (so that a peer's step that still needs it fails saying so),
// then waits at a barrier (bounded by the start-up timeout) until every
// worker has reached its own Close, so that no worker leaves while a peer
// still needs it, and releases the group's connections or the server. A
// strategy that cannot go on tells its peers why instead, and holds no
// barrier. TensorFlow keeps a started server's port until the process
// exits. Close is idempotent.
func (s *Strategy) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Strategy) close() error {
	err := s.engine.Close()
	if s.obs != nil {
		err = errors.Join(err, s.obs.close())
	}
	if s.group != nil {
		s.unregister()
		failed := s.engine.Err()
		broken := s.group.Err() != nil || failed != nil
		ctx, cancel := context.WithTimeout(context.Background(), s.closeTimeout)
		defer cancel()
		if failed != nil {
			s.group.Abort(fmt.Errorf("worker %d closed its strategy after: %w", s.workerID, failed))
		}
		if broken {
			cancel() // no barrier: the peers are gone or out of step
		}
		if cerr := s.group.Close(ctx); cerr != nil && !broken {
			err = errors.Join(err, fmt.Errorf("multiworker: task %s: closing barrier: %w", s.task, cerr))
		}
	}
	if s.server != nil {
		if s.engine.Err() == nil {
			s.announceFinished()
			err = errors.Join(err, s.closingRounds())
		}
		err = errors.Join(err, s.server.Close())
	}
	return err
}

// closingRounds holds TensorFlow's closing barrier: two rounds, since its
// transfers are pulled by the receiver. A worker that finishes a round has
// received every peer's value, but a peer may still be pulling its own; the
// second round finishes only once every worker has finished the first, so
// a worker that leaves after it strands no peer in the first. The first
// round's success already proves that every worker reached Close, so a
// second round that fails because a peer left first is not an error.
func (s *Strategy) closingRounds() error {
	if _, err := s.round(context.Background(), "closing_barrier", 0, s.closeTimeout); err != nil {
		return fmt.Errorf("multiworker: task %s: closing barrier: %w", s.task, err)
	}
	if _, err := s.round(context.Background(), "closing_release", 0, s.closeTimeout); err != nil {
		s.log.Debug("a peer left during the closing barrier's second round", zap.Error(err))
	}
	return nil
}

// engine names the embedded engine without exporting it as a field.
type engine = ingraph.Engine
