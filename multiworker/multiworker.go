// Package multiworker is MultiWorkerMirroredStrategy: synchronous data
// parallelism across machines. Every worker runs the same program, reads its
// TF_CONFIG, starts its in-process TensorFlow server, and builds the same
// graph for its local devices (between-graph replication). Gradients are
// summed across every replica of every worker by TensorFlow's collective ops
// (ring all-reduce over gRPC on CPUs, NCCL on GPUs), so all copies of every
// variable stay identical.
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
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/strategy"
)

// Strategy is MultiWorkerMirroredStrategy: a strategy.InGraph engine whose
// CrossDeviceOps are collectives spanning the cluster.
type Strategy struct {
	*strategy.InGraph
	resolver cluster.Resolver
	task     cluster.Task
	workerID int
	workers  []cluster.Task
	server   *tfrt.Server
	log      *zap.Logger
}

type config struct {
	resolver       cluster.Resolver
	logicalCPUs    int
	comm           Communication
	bytesPerPack   int64
	timeout        time.Duration
	startupTimeout time.Duration
	intra, inter   int
	log            *zap.Logger
}

// Option configures New.
type Option func(*config)

// WithResolver takes the cluster from r instead of TF_CONFIG.
func WithResolver(r cluster.Resolver) Option { return func(c *config) { c.resolver = r } }

// WithLogicalCPUs runs n replicas per worker on n logical CPU devices
// (default: every GPU of the worker, else one CPU replica). Every worker must
// have the same number of replicas.
func WithLogicalCPUs(n int) Option { return func(c *config) { c.logicalCPUs = n } }

// WithCommunication chooses ring or NCCL collectives (default Auto).
func WithCommunication(comm Communication) Option { return func(c *config) { c.comm = comm } }

// WithBytesPerPack packs gradients into buffers of up to n bytes before the
// all-reduce (default 32 MiB; 0 turns packing off).
func WithBytesPerPack(n int64) Option { return func(c *config) { c.bytesPerPack = n } }

// WithCollectiveTimeout bounds how long a step waits for its peers: when a
// peer dies or stops responding, the survivors' step fails within d with an
// error naming the task, and the strategy then refuses further steps
// (strategy.ErrCannotContinue). The bound is each run's deadline (the
// session's operation timeout), whose cancellation aborts the step's
// collectives; it costs nothing per collective, however fast the steps, but
// it covers a whole step, so d must exceed the slowest step's compute time
// plus the time peers may lag (a chief's checkpoint, say). Default 60 s; 0
// waits forever, and New logs a warning; a negative d is an error.
func WithCollectiveTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithStartupTimeout bounds how long New waits for every worker to join
// (default 120 s).
func WithStartupTimeout(d time.Duration) Option { return func(c *config) { c.startupTimeout = d } }

// WithThreads sets TensorFlow's intra-op and inter-op thread pool sizes.
func WithThreads(intraOp, interOp int) Option {
	return func(c *config) { c.intra, c.inter = intraOp, interOp }
}

// WithLogger sets the logger; log lines carry the task type and index.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// New starts this task's TensorFlow server, waits for every worker to join
// and checks that all of them were given the same cluster. TF_CONFIG names a
// chief or worker task; ps and evaluator tasks are an error.
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
	spec := c.resolver.ClusterSpec()
	task := cluster.TaskOf(c.resolver)
	log := logging.OrNop(c.log)
	if spec.IsEmpty() || spec.WorkerCount() <= 1 && spec.NumTasks(cluster.PS) == 0 {
		return newLocal(c, task, log)
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
	log = logging.ForTask(log, string(task.Type), task.Index)
	if c.timeout == 0 {
		log.Warn("collective timeout 0: a step waits forever for its peers, so a dead or stopped peer hangs this worker")
	}

	nLocal := max(c.logicalCPUs, 1)
	leader := cluster.TaskDevice(string(workers[0].Type), workers[0].Index)
	sessOpts := []tfrt.ConfigOption{
		tfrt.WithLogicalCPUs(nLocal),
		tfrt.WithCollectiveGroupLeader(leader),
		tfrt.WithDeviceFilters(fmt.Sprintf("/job:%s/task:%d", task.Type, task.Index)),
	}
	intra, inter := tfrt.DefaultThreads()
	if c.intra > 0 {
		intra = c.intra
	}
	if c.inter > 0 {
		inter = c.inter
	}
	sessOpts = append(sessOpts, tfrt.WithThreads(intra, inter))
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

	var devices []string
	for j := range nLocal {
		devices = append(devices, cluster.DeviceName(string(task.Type), task.Index, "CPU", j))
	}
	cdo := &CollectiveOps{GroupSize: nLocal * len(workers), GroupKey: 1, FirstReplica: workerID * nLocal,
		Communication: c.comm}
	if c.comm == NCCL {
		if err := cdo.check(devices); err != nil {
			return nil, err
		}
	}
	var cross strategy.CrossDeviceOps = cdo
	if c.bytesPerPack > 0 {
		cross = strategy.Packed{Inner: cdo, BytesPerPack: c.bytesPerPack}
	}
	s := &Strategy{resolver: c.resolver, task: task, workerID: workerID, workers: workers, server: srv, log: log}
	e, err := strategy.NewInGraph(strategy.Config{
		Name:              "multiworker",
		Devices:           devices,
		HostDevice:        cluster.DeviceName(string(task.Type), task.Index, "CPU", 0),
		NumReplicasInSync: nLocal * len(workers),
		FirstReplicaID:    workerID * nLocal,
		NumWorkers:        len(workers),
		WorkerID:          workerID,
		CrossDeviceOps:    cross,
		Target:            srv.Target(),
		SessionOptions:    append(slices.Clip(sessOpts), tfrt.WithOperationTimeout(c.timeout)),
		Logger:            log,
		DiagnoseRunError:  s.diagnose,
	})
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	s.InGraph = e
	if err := s.handshake(ctx, cdo, spec, sessOpts, c.startupTimeout); err != nil {
		e.Close()
		return nil, err
	}
	log.Info("all workers joined", zap.Int("replicas_in_sync", e.NumReplicasInSync()))
	return s, nil
}

// newLocal is the single-worker case: collectives among the local devices
// of an in-process session.
func newLocal(c config, task cluster.Task, log *zap.Logger) (*Strategy, error) {
	n := max(c.logicalCPUs, 1)
	var devices []string
	for j := range n {
		devices = append(devices, strategy.LocalCPU(j))
	}
	cdo := &CollectiveOps{GroupSize: n, GroupKey: 1, Communication: c.comm}
	var cross strategy.CrossDeviceOps = cdo
	if c.bytesPerPack > 0 && n > 1 {
		cross = strategy.Packed{Inner: cdo, BytesPerPack: c.bytesPerPack}
	}
	intra, inter := tfrt.DefaultThreads()
	e, err := strategy.NewInGraph(strategy.Config{
		Name: "multiworker", Devices: devices, CrossDeviceOps: cross, Logger: log,
		SessionOptions: []tfrt.ConfigOption{tfrt.WithLogicalCPUs(n), tfrt.WithThreads(intra, inter)},
	})
	if err != nil {
		return nil, fmt.Errorf("multiworker: %w", err)
	}
	return &Strategy{InGraph: e, resolver: c.resolver, task: task, workers: []cluster.Task{task}, log: log}, nil
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
// It is every worker's first collective, so its instance key agrees. It runs
// in a graph and session of its own, whose deadline is the start-up timeout
// rather than the steps' collective timeout.
func (s *Strategy) handshake(ctx context.Context, cdo *CollectiveOps, spec cluster.ClusterSpec, sessOpts []tfrt.ConfigOption, timeout time.Duration) error {
	fp := spec.Fingerprint()
	mine := int64(binary.LittleEndian.Uint64(binary.LittleEndian.AppendUint64(nil, uint64(fp))))
	hs := &CollectiveOps{GroupSize: cdo.GroupSize, GroupKey: cdo.GroupKey, FirstReplica: cdo.FirstReplica,
		Communication: cdo.Communication}
	hs.next = cdo.instanceKey() - 1
	g := tf.NewGraph()
	sc := op.NewScopeWithGraph(g).SubScope("handshake")
	devices := s.Devices()
	vals := make([][]tf.Output, len(devices))
	for r, d := range devices {
		vals[r] = []tf.Output{op.Const(sc.SubScope(fmt.Sprintf("fingerprint_%d", r)).WithDevice(d), []int64{mine})}
	}
	out, err := hs.BatchGather(sc.SubScope("gather"), vals, devices)
	if err != nil {
		return fmt.Errorf("multiworker: task %s: build the start-up handshake: %w", s.task, err)
	}
	so, err := tfrt.SessionOptions(s.server.Target(), append(slices.Clip(sessOpts), tfrt.WithOperationTimeout(timeout))...)
	if err != nil {
		return fmt.Errorf("multiworker: task %s: %w", s.task, err)
	}
	var targets []*tf.Operation
	for r := range out {
		targets = append(targets, out[r][0].Op)
	}
	type result struct {
		t   []*tf.Tensor
		err error
	}
	done := make(chan result, 1)
	go func() {
		sess, err := tf.NewSession(g, so)
		if err != nil {
			done <- result{nil, tfrt.Classify("open the handshake session", err)}
			return
		}
		t, err := sess.Run(nil, []tf.Output{out[0][0]}, targets)
		if err != nil {
			err = tfrt.Classify("run the handshake", err)
		}
		done <- result{t, err}
		if err == nil {
			sess.Close() // a session whose peers are gone may hang in Close
		}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(timeout + 30*time.Second):
		return fmt.Errorf("multiworker: task %s: not every worker joined within %v; %s", s.task, timeout, s.unreachable())
	case <-ctx.Done():
		return fmt.Errorf("multiworker: task %s: waiting for workers: %w", s.task, ctx.Err())
	}
	if res.err != nil {
		if u := s.unreachable(); u != "" {
			return fmt.Errorf("multiworker: task %s: waiting %v for every worker to join: %s: %w", s.task, timeout, u, res.err)
		}
		return fmt.Errorf("multiworker: task %s: waiting %v for every worker to join: %w", s.task, timeout, res.err)
	}
	all := res.t[0].Value().([]int64)
	got := map[cluster.Task]cluster.Fingerprint{}
	n := s.NumLocalReplicas()
	for w, task := range s.workers {
		got[task] = cluster.Fingerprint(binary.LittleEndian.Uint64(binary.LittleEndian.AppendUint64(nil, uint64(all[w*n]))))
	}
	if err := cluster.CheckFingerprints(fp, got); err != nil {
		return fmt.Errorf("multiworker: task %s: %w", s.task, err)
	}
	return nil
}

// duplicateRequest is in the error of a step that a TensorFlow worker
// refused because its request id repeated one of its last 100,000.
const duplicateRequest = "request was received twice"

// diagnose names the peers that cannot be reached when a run fails in a way
// a dead or silent peer causes (an error of the step's collectives, or the
// step's deadline). Such a failure ends the strategy: the error wraps
// strategy.ErrCannotContinue.
func (s *Strategy) diagnose(err error) error {
	if !(errors.Is(err, tfrt.ErrUnavailable) || errors.Is(err, tfrt.ErrDeadlineExceeded) ||
		errors.Is(err, tfrt.ErrAborted) || errors.Is(err, tfrt.ErrCancelled) || errors.Is(err, tfrt.ErrUnknown)) {
		return err
	}
	what := "a step across workers failed"
	if strings.Contains(err.Error(), duplicateRequest) {
		what = "TensorFlow's runtime refused the step as a repeated request, a defect of its distributed sessions " +
			"(each step's request id has only 32 random bits, and a worker refuses one it saw among its last 100,000), " +
			"which ends a step loop every few tens of thousands of steps"
	} else if u := s.unreachable(); u != "" {
		what = u
	}
	return fmt.Errorf("multiworker: task %s: %s: %w; %w", s.task, what, err, strategy.ErrCannotContinue)
}

// unreachable checks every other worker and describes those that are dead
// (no TCP connection) or unresponsive (TensorFlow's server does not run an
// op within a few seconds, e.g. a stopped or wedged process).
func (s *Strategy) unreachable() string {
	var dead, silent []string
	spec := s.resolver.ClusterSpec()
	for _, w := range s.workers {
		if w == s.task {
			continue
		}
		addr, err := spec.TaskAddress(w.Type, w.Index)
		if err != nil {
			continue
		}
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			dead = append(dead, fmt.Sprintf("%s (%s)", w, addr))
			continue
		}
		conn.Close()
		if s.server != nil && !s.responds(w, 5*time.Second) {
			silent = append(silent, fmt.Sprintf("%s (%s)", w, addr))
		}
	}
	var parts []string
	if len(dead) > 0 {
		parts = append(parts, "unreachable peer task(s): "+strings.Join(dead, ", "))
	}
	if len(silent) > 0 {
		parts = append(parts, "peer task(s) that accept connections but do not respond: "+strings.Join(silent, ", "))
	}
	return strings.Join(parts, "; ")
}

// responds runs a trivial op on task t's CPU through this task's server and
// reports whether it came back within timeout.
func (s *Strategy) responds(t cluster.Task, timeout time.Duration) bool {
	g := tf.NewGraph()
	sc := op.NewScopeWithGraph(g).WithDevice(cluster.DeviceName(string(t.Type), t.Index, "CPU", 0))
	c := op.Const(sc.SubScope("probe"), int32(1))
	if sc.Err() != nil {
		return false
	}
	so, err := tfrt.SessionOptions(s.server.Target(),
		tfrt.WithDeviceFilters(fmt.Sprintf("/job:%s/task:%d", t.Type, t.Index), fmt.Sprintf("/job:%s/task:%d", s.task.Type, s.task.Index)),
		tfrt.WithOperationTimeout(timeout))
	if err != nil {
		return false
	}
	done := make(chan bool, 1)
	go func() {
		sess, err := tf.NewSession(g, so)
		if err != nil {
			done <- false
			return
		}
		_, err = sess.Run(nil, []tf.Output{c}, nil)
		done <- err == nil
		if err == nil {
			sess.Close()
		}
		// A session whose peer is gone can hang in Close; it is left to
		// the process's exit rather than block the diagnosis.
	}()
	select {
	case ok := <-done:
		return ok
	case <-time.After(timeout + 2*time.Second):
		return false
	}
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

// Close releases the session and the server. TensorFlow keeps a started
// server's port until the process exits.
func (s *Strategy) Close() error {
	err := s.InGraph.Close()
	if s.server != nil {
		err = errors.Join(err, s.server.Close())
	}
	return err
}
