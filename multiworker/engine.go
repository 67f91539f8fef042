package multiworker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/internal/voting"
	"github.com/tfdist/tfdist/strategy"
)

// engineOps is the CrossDeviceOps of MultiWorkerMirrored on tfdist's own
// engine: a worker first combines its local replicas' values on its host
// CPU, then one collective op per tensor (per pack, with packing) hands the
// result to the collective.Group, and the result goes back to every local
// replica's device (see sumOnHost and fromHost). The ops are async
// kernels: a pack's all-reduce starts as soon as its gradients exist and
// overlaps the rest of the step.
//
// Op names are handed out in build order, so workers that build the same
// program match their ops without talking.
type engineOps struct {
	group      string           // the group's id in engineops' registry
	aggregator string           // the voter's id in engineops' registry, with WithAggregation
	wire       collective.DType // what float32 all-reduces travel as, 0: themselves
	topK       float64          // the ratio of TopK, 0 without
	residuals  *residuals       // TopK's, shared with the Strategy
	host       string           // this worker's host CPU
	replicas   int              // replicas in sync across every worker
	tree       bool             // sums in tree order (WithDeterministic)
	names      *opNames         // shared by the copies WithCompression makes
}

// opNames hands out op names in build order.
type opNames struct {
	mu   sync.Mutex
	next int
}

func (c *engineOps) name(kind string) string {
	c.names.mu.Lock()
	defer c.names.mu.Unlock()
	c.names.next++
	return fmt.Sprintf("%s_%d", kind, c.names.next)
}

// check names the first value whose dtype the engine cannot combine.
func (c *engineOps) check(what string, values [][]tf.Output) error {
	if len(values) == 0 {
		return fmt.Errorf("multiworker: %s: no replicas", what)
	}
	for i, v := range values[0] {
		if _, ok := engineops.CollectiveDType(v.DataType()); !ok {
			return fmt.Errorf("multiworker: %s of value %d: dtype %s; tfdist's collective engine takes float32, float64, float16, bfloat16, int32 and int64 (WithCommunication(Ring) takes others)",
				what, i, graphutil.DTypeName(v.DataType()))
		}
	}
	return nil
}

// appendPerReplica appends value k of every replica, vals[r], to out[r].
func appendPerReplica(out [][]tf.Output, vals []tf.Output) {
	for r, v := range vals {
		out[r] = append(out[r], v)
	}
}

// BatchReduce implements strategy.CrossDeviceOps.
func (c *engineOps) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check("all-reduce", values); err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(values))
	for k := range values[0] {
		name := c.name("allreduce")
		ns := s.SubScope(name)
		hs := ns.WithDevice(c.host)
		v := c.sum(ns, name, column(values, k), devices)
		if red == strategy.Mean {
			n := op.Cast(hs.SubScope("n"), op.Const(hs.SubScope("replicas"), int32(c.replicas)), v.DataType())
			v = op.Div(hs.SubScope("mean"), v, n)
		}
		appendPerReplica(out, fromHost(ns, v, devices))
	}
	return out, s.Err()
}

// sum sums parts, one value of each local replica, across every replica
// of every worker, onto the host: in tree order (WithDeterministic), with
// TopK, or as they are.
func (c *engineOps) sum(ns *op.Scope, name string, parts []tf.Output, devices []string) tf.Output {
	hs := ns.WithDevice(c.host)
	if c.tree {
		local := ingraph.TreeSumOn(hs.SubScope("local"), parts, devices, c.host)
		return engineops.AllReduceInTreeOrder(hs.SubScope("engine"), local, c.group, name)
	}
	local := sumOnHost(ns.SubScope("local"), c.host, parts, devices)
	if n := c.sparseSize(local); n > 0 {
		return c.sparseSum(hs.SubScope("top_k"), name, local, n)
	}
	return engineops.AllReduce(hs.SubScope("engine"), local, c.group, name, collective.Sum, c.wireFor(local))
}

// BatchGather implements strategy.CrossDeviceOps.
func (c *engineOps) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check("all-gather", values); err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(values))
	for k := range values[0] {
		name := c.name("allgather")
		ns := s.SubScope(name)
		hs := ns.WithDevice(c.host)
		cat := concatOnHost(hs.SubScope("local"), column(values, k))
		appendPerReplica(out, fromHost(ns, engineops.AllGather(hs.SubScope("engine"), cat, c.group, name), devices))
	}
	return out, s.Err()
}

// Broadcast implements ingraph.Broadcaster: worker 0 sends its replica 0's
// value, and every replica of every worker receives it.
func (c *engineOps) Broadcast(s *op.Scope, value tf.Output, devices []string) ([]tf.Output, error) {
	if err := c.check("broadcast", [][]tf.Output{{value}}); err != nil {
		return nil, err
	}
	name := c.name("broadcast")
	ns := s.SubScope(name)
	return fromHost(ns, engineops.Broadcast(ns.WithDevice(c.host).SubScope("engine"), value, c.group, name, 0), devices), s.Err()
}

// memberName is the name of worker t in the engine's group: its task's, or
// in an elastic job the name it joined as, which its certificate names
// when the job runs TLS.
func (c config) memberName(t cluster.Task) string {
	if c.names != nil {
		return c.names[t.Index]
	}
	return t.String()
}

// newOnEngine runs the collectives on tfdist's engine: the worker listens on
// its task's port for its peers' connections, and steps run in an
// in-process session, with no TensorFlow server.
func newOnEngine(ctx context.Context, c config, w joined) (*Strategy, error) {
	members := make([]collective.Member, len(w.workers))
	for i, t := range w.workers {
		addr, err := w.spec.TaskAddress(t.Type, t.Index)
		if err != nil {
			return nil, fmt.Errorf("multiworker: %w", err)
		}
		members[i] = collective.Member{Name: c.memberName(t), Addr: addr}
	}
	secure, err := c.security(w.log)
	if err != nil {
		return nil, err
	}
	if c.listener != nil {
		secure = append(secure, collective.WithListener(c.listener), collective.WithEpoch(c.epoch))
	}
	g, err := collective.New(ctx, members, w.workerID, append(secure,
		collective.WithFingerprint(uint64(w.spec.Fingerprint())),
		collective.WithTimeout(c.timeout),
		collective.WithStartupTimeout(c.startupTimeout),
		collective.WithSharedMemory(!c.tcpOnly),
		collective.WithObserver(w.obs.collective),
		collective.WithLogger(w.log))...)
	if err != nil {
		return nil, fmt.Errorf("multiworker: task %s: %w", w.task, err)
	}
	w.log.Info("collective group joined", zap.String("address", members[w.workerID].Addr),
		zap.Int("workers", len(w.workers)), zap.Int("local_replicas", w.nLocal()))
	if err := checkWorkersAlike(ctx, g, w, c); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), c.closeTimeout())
		defer cancel()
		g.Abort(err)
		_ = g.Close(cctx) // it reports the abort, err
		return nil, err
	}
	id, unregister := engineops.RegisterGroup(g)
	devices := w.devices
	replicas := w.nLocal() * len(w.workers)
	if c.shards > 0 {
		replicas = c.shards
	}
	cdo := &engineOps{group: id, host: strategy.LocalCPU(0), replicas: replicas, tree: c.shards > 0, names: &opNames{}}
	cross := c.packed(cdo)
	grads := cross // how a synchronous step's gradients are summed
	s := &Strategy{resolver: c.resolver, task: w.task, workerID: w.workerID, workers: w.workers,
		group: g, unregister: unregister, closeTimeout: c.closeTimeout(), log: w.log}
	var reducer ingraph.GradientReducer
	if c.aggregation != nil {
		names := make([]string, len(w.workers))
		for i, t := range w.workers {
			names[i] = c.memberName(t)
		}
		s.voter = voting.New(c.aggregation, names, w.log)
		var unregisterVoter func()
		cdo.aggregator, unregisterVoter = engineops.RegisterAggregator(s.voter.Aggregate)
		s.unregister = func() { unregister(); unregisterVoter() }
		reducer = cdo
	}
	if c.compression != None && c.zero == 0 { // WithZeRO compresses its reduce-scatters (zeroOps)
		comp := cdo.compressing(c.compression)
		if c.compression.kind == topK {
			s.residuals = &residuals{group: id}
			comp.residuals = s.residuals
		}
		grads = c.packed(comp)
		reducer = compressed{grads}
	}
	var pendingInit func() ([]*tf.Operation, func())
	if s.residuals != nil {
		pendingInit = s.residuals.pending
	}
	inSync := w.nLocal() * len(w.workers)
	if c.localSGD != nil { // a step spans this worker's replicas
		s.localSGD = &localSGD{cfg: *c.localSGD, group: id, workers: len(w.workers)}
		local := localCrossDeviceOps(devices)
		if c.localSGD.WarmupSteps > 0 {
			s.localSGD.warm = &warmup{local: local, cross: grads, workers: len(w.workers)}
			reducer = s.localSGD.warm
		}
		cross, inSync = local, w.nLocal()
	}
	so, err := tfrt.SessionOptions("", w.sessionOptions(c, engineSessionOptions(c, w.nLocal())...)...)
	var e *ingraph.Engine
	if err == nil {
		e, err = ingraph.New(ingraph.Config{
			Name:              "multiworker",
			Devices:           devices,
			NumReplicasInSync: inSync,
			FirstReplicaID:    w.workerID * w.nLocal(),
			NumWorkers:        len(w.workers),
			WorkerID:          w.workerID,
			IndependentSteps:  c.localSGD != nil,
			CrossDeviceOps:    cross,
			GradientReducer:   reducer,
			Session:           so,
			Logger:            w.log,
			DiagnoseRunError:  s.diagnose,
			AbortPeers:        g.Abort,
			PendingInit:       pendingInit,
			VirtualShards:     c.shards,
			Sharding:          c.sharding(cdo, len(w.workers), w.workerID),
		})
	}
	if err != nil {
		s.unregister()
		cctx, cancel := context.WithTimeout(context.Background(), s.closeTimeout)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("multiworker: %w", err), g.Close(cctx))
	}
	s.engine = e
	return s, nil
}

// checkWorkersAlike refuses, on every worker, a cluster whose workers
// have different numbers of replicas, or, under WithDeterministic,
// compute otherwise (checkArithmetic).
func checkWorkersAlike(ctx context.Context, g *collective.Group, w joined, c config) error {
	if err := checkReplicaCounts(ctx, g, w, c.startupTimeout); err != nil {
		return err
	}
	if c.shards == 0 {
		return nil
	}
	return checkArithmetic(ctx, g, w, c)
}

// checkArithmetic refuses a deterministic job whose workers differ in
// what decides their kernels' roundings (their TensorFlow build,
// intra-op threads, oneDNN, instruction set): it would train another
// model than one device does, with nothing to tell. Every worker of a
// static job fails; in an elastic one, a worker that differs from the
// holder of the job's state fails with ErrArithmeticMismatch, and the
// others with an error that makes them re-form without it.
func checkArithmetic(ctx context.Context, g *collective.Group, w joined, c config) error {
	ctx, cancel := context.WithTimeout(ctx, c.startupTimeout)
	defer cancel()
	name := func(t cluster.Task) string { return "task " + c.memberName(t) }
	mine := tfrt.LocalArithmetic(c.pools.intra)
	b, err := json.Marshal(mine)
	if err != nil {
		return fmt.Errorf("multiworker: %s: %w", name(w.task), err)
	}
	all, err := g.AllGather(ctx, "tfdist_arithmetic", collective.Int8, b)
	if err != nil {
		return fmt.Errorf("multiworker: %s: gather the workers' arithmetic: %w", name(w.task), err)
	}
	theirs := make([]tfrt.Arithmetic, len(all))
	for i, b := range all {
		if err := json.Unmarshal(b, &theirs[i]); err != nil {
			return fmt.Errorf("multiworker: %s: the arithmetic of %s: %w", name(w.task), name(w.workers[i]), err)
		}
	}
	ref, refName := mine, name(w.task)
	if c.names != nil { // elastic: the holder's is the job's
		ref, refName = theirs[c.holder], name(w.workers[c.holder])+" (which holds the job's state)"
		if err := mine.Match(ref, name(w.task), refName); err != nil {
			return fmt.Errorf("%w: deterministic with %d virtual shards: %w", ErrArithmeticMismatch, c.shards, err)
		}
	}
	for i, a := range theirs {
		if err := ref.Match(a, refName, name(w.workers[i])); err != nil {
			return fmt.Errorf("multiworker: deterministic with %d virtual shards: %w", c.shards, err)
		}
	}
	return nil
}

// checkReplicaCounts refuses, on every worker, a cluster whose workers
// have different numbers of replicas: each worker's replicas are a fixed
// share of the global batch and of NumReplicasInSync.
func checkReplicaCounts(ctx context.Context, g *collective.Group, w joined, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	all, err := g.AllGather(ctx, "tfdist_replica_counts", collective.Int64, binary.LittleEndian.AppendUint64(nil, uint64(w.nLocal())))
	if err != nil {
		return fmt.Errorf("multiworker: task %s: gather the workers' replica counts: %w", w.task, err)
	}
	counts := make([]int, len(all))
	for i, b := range all {
		counts[i] = int(binary.LittleEndian.Uint64(b))
	}
	return sameReplicaCounts(w.task, w.devices, w.workers, counts)
}

// engineSessionOptions tunes a worker's session for steps that wait on
// tfdist's engine (its pools, which sleep rather than spin, are
// sessionBase's): a worker with one device, unless WithThreads sets the
// inter-op pool, runs its steps on the calling thread, which saves thread
// hand-offs in every step.
func engineSessionOptions(c config, nLocal int) []tfrt.ConfigOption {
	if nLocal == 1 && c.inter <= 0 {
		return []tfrt.ConfigOption{tfrt.WithStepsOnCallerThread()}
	}
	return nil
}
