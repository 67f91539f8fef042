package dataset

import (
	"context"
	"fmt"
	"io"
	"iter"
	"time"

	"go.uber.org/zap"
)

// InputContext describes one input pipeline of a distributed job, as
// tf.distribute.InputContext does.
type InputContext struct {
	// NumInputPipelines is the number of input pipelines: one per worker.
	NumInputPipelines int
	// InputPipelineID is this pipeline's index, in [0, NumInputPipelines):
	// the worker's index.
	InputPipelineID int
	// NumReplicasInSync is the number of replicas that take part in one
	// synchronous step, across all workers.
	NumReplicasInSync int
}

// Validate reports whether the counts are consistent.
func (c InputContext) Validate() error {
	switch {
	case c.NumInputPipelines < 1:
		return fmt.Errorf("dataset: input context: %w: NumInputPipelines %d, expected at least 1", ErrInvalidArgument, c.NumInputPipelines)
	case c.InputPipelineID < 0 || c.InputPipelineID >= c.NumInputPipelines:
		return fmt.Errorf("dataset: input context: %w: InputPipelineID %d, expected 0 <= id < NumInputPipelines (%d)",
			ErrInvalidArgument, c.InputPipelineID, c.NumInputPipelines)
	case c.NumReplicasInSync < 1:
		return fmt.Errorf("dataset: input context: %w: NumReplicasInSync %d, expected at least 1", ErrInvalidArgument, c.NumReplicasInSync)
	}
	return nil
}

// PerReplicaBatchSize returns the batch each replica takes from a global
// batch of global examples: global / NumReplicasInSync. It fails with
// ErrNotDivisible when that does not divide evenly.
func (c InputContext) PerReplicaBatchSize(global int) (int, error) {
	if c.NumReplicasInSync < 1 {
		return 0, fmt.Errorf("dataset: %w: NumReplicasInSync %d, expected at least 1", ErrInvalidArgument, c.NumReplicasInSync)
	}
	if global < 1 {
		return 0, fmt.Errorf("dataset: %w: global batch size %d, expected at least 1", ErrInvalidArgument, global)
	}
	if global%c.NumReplicasInSync != 0 {
		return 0, fmt.Errorf("dataset: %w: global batch size %d by %d replicas in sync (%d per replica, remainder %d)",
			ErrNotDivisible, global, c.NumReplicasInSync, global/c.NumReplicasInSync, global%c.NumReplicasInSync)
	}
	return global / c.NumReplicasInSync, nil
}

// ShardPolicy says how Distribute divides a dataset among workers, as
// tf.data.experimental.AutoShardPolicy does.
type ShardPolicy int

const (
	// ShardAuto shards by FILE when the dataset reads files (TFRecordFiles,
	// or the ListFiles below an Interleave) and has at least as many files
	// as workers, and by DATA otherwise.
	ShardAuto ShardPolicy = iota
	// ShardFile gives each worker whole files: worker w reads files i with
	// i mod workers == w, and batches by the per-worker batch (global /
	// workers). It fails with ErrTooFewFiles when there are fewer files than
	// workers, and with ErrNoFileSource when the dataset reads no files or
	// its batch cannot be found. Stages before the batch then run on each
	// worker's share: Take(ds, 1000) before Batched takes 1000 examples per
	// worker. Workers whose files hold different numbers of examples run
	// out at different steps; a multi-worker strategy keeps them in step
	// with padding batches until every worker's input has ended (see
	// Batch.NeedsAgreement).
	ShardFile
	// ShardData has every worker read the whole dataset and keep element i
	// (counting examples, the rows of the global batches) when i mod workers
	// == w. At step k the workers' shares together are exactly global batch
	// k. The dataset must yield the same order on every worker: seed its
	// shuffles.
	ShardData
	// ShardOff gives every worker all the data: each worker's step takes the
	// next per-worker share (global / workers examples) of the same
	// sequence, so the workers see identical inputs.
	ShardOff
	// ShardBatch has every worker read the whole dataset and keep, of each
	// global batch, the rows its replicas would get if one worker ran every
	// replica: the batch is split among the NumReplicasInSync replicas in
	// contiguous parts (sizes differing by at most one), and worker w's
	// replicas take parts w×local to (w+1)×local−1. Each replica then sees
	// the same examples whatever the number of workers, which
	// topology-invariant training needs. Like DATA, it needs the same
	// order on every worker.
	ShardBatch
)

// String returns the policy's name.
func (p ShardPolicy) String() string {
	switch p {
	case ShardAuto:
		return "AUTO"
	case ShardFile:
		return "FILE"
	case ShardData:
		return "DATA"
	case ShardOff:
		return "OFF"
	case ShardBatch:
		return "BATCH"
	}
	return fmt.Sprintf("ShardPolicy(%d)", int(p))
}

// StageFunc stages a batch toward the devices that will consume it, for
// example by running TensorFlow Stage ops that copy it into a staging area on
// each replica's device. Distributed iterators call it on every batch before
// handing it out; with prefetching it runs on the prefetch goroutine, so the
// next step's inputs are staged while the current step runs.
type StageFunc func(ctx context.Context, b *Batch) error

// DistributeOption configures Distribute and DistributeFromFunction.
type DistributeOption interface{ applyDistribute(*distConfig) }

type distConfig struct {
	policy   ShardPolicy
	prefetch int
	stage    StageFunc
	global   int
	log      *zap.Logger
}

type distOptionFunc func(*distConfig)

func (f distOptionFunc) applyDistribute(c *distConfig) { f(c) }

// WithShardPolicy sets how Distribute divides the data among workers
// (default ShardAuto). DistributeFromFunction ignores it: its function
// shards as it sees fit, with the InputContext it is given.
func WithShardPolicy(p ShardPolicy) DistributeOption {
	return distOptionFunc(func(c *distConfig) { c.policy = p })
}

// WithPrefetch sets how many batches a goroutine prepares ahead of the
// consumer: read, split per replica, turned into tensors and staged (default
// 1). 0 prepares each batch when Next is called.
func WithPrefetch(n int) DistributeOption {
	return distOptionFunc(func(c *distConfig) { c.prefetch = max(n, 0) })
}

// WithStage sets a function that stages each batch toward its devices (see
// StageFunc).
func WithStage(fn StageFunc) DistributeOption {
	return distOptionFunc(func(c *distConfig) { c.stage = fn })
}

// WithGlobalBatchSize states the global batch size. Distribute finds it on
// its own when the dataset was batched by Batched; for another dataset it
// otherwise takes the size of the first batch, which is wrong if that batch
// is already partial. DistributeFromFunction uses it to check each
// per-replica batch and to report GlobalCount across workers.
func WithGlobalBatchSize(n int) DistributeOption {
	return distOptionFunc(func(c *distConfig) { c.global = n })
}

// Batch is one step's input on this worker: one element per local replica.
type Batch struct {
	// Replicas holds one element per local replica, in replica order. Each
	// tensor has a leading dimension of Counts[i], which may be 0 at the
	// end of the data.
	Replicas []Element
	// Counts holds the number of examples of each local replica.
	Counts []int
	// GlobalCount is the number of examples in this step across all
	// replicas of all workers: the divisor that makes a sum of per-example
	// losses the mean over the global batch. When GlobalCountExact is false
	// this worker could not see the others' inputs (FILE sharding, or
	// DistributeFromFunction over several workers); GlobalCount then assumes
	// every other worker's step is full, which holds for every step but
	// those at the end of the data, and a multi-worker strategy that needs
	// the exact count all-reduces LocalCount instead.
	GlobalCount int
	// GlobalCountExact reports whether GlobalCount is exact.
	GlobalCountExact bool
	// Step is the index of this step in the pass, from 0.
	Step int
	// Padding reports a batch of no examples, whose elements hold no
	// tensors: this worker's input has ended while another worker's has
	// not, so it runs the step without examples (see NeedsAgreement).
	Padding bool

	agree *agreement // set in a pass whose workers must agree on its end

	asked, got time.Time // when Next was called for the batch and when it returned it
}

// InputTime returns when Next was called for the batch and when it
// returned it: the time a step waited for its input.
func (b *Batch) InputTime() (asked, got time.Time) { return b.asked, b.got }

// LocalCount returns the number of examples of this worker's replicas.
func (b *Batch) LocalCount() int {
	n := 0
	for _, c := range b.Counts {
		n += c
	}
	return n
}

// Distributed is a dataset divided among the workers and replicas of a
// distributed job: each pass yields, at each step, this worker's share of
// the global batch split into per-replica batches.
//
// Strategies feed Batch.Replicas[i] to replica i and use Batch.GlobalCount
// as the loss normaliser: the per-example losses of every replica are summed
// and divided by the number of examples actually in the global step, which
// a strategy feeds to the step graph on every run (a scalar placeholder)
// rather than baking in the nominal global batch. A partial final batch
// (Batched without dropRemainder) is split as evenly as possible, so its
// gradients are weighted exactly like those of one device on the same
// examples.
type Distributed struct {
	ds     Dataset
	policy ShardPolicy // effective
	ictx   InputContext
	local  int
	global int // nominal global batch; 0 when inferred from the first batch
	// variable: the global batches are Poisson samples, of any size.
	variable bool
	fromFn   bool
	// perReplica, from DistributePerReplica, holds each local replica's
	// own dataset, in place of ds.
	perReplica []Dataset
	cfg        distConfig
}

func newDistConfig(opts []DistributeOption) distConfig {
	cfg := distConfig{policy: ShardAuto, prefetch: 1, log: zap.NewNop()}
	for _, o := range opts {
		o.applyDistribute(&cfg)
	}
	return cfg
}

func checkReplicas(ictx InputContext, localReplicas int) error {
	if err := ictx.Validate(); err != nil {
		return err
	}
	if localReplicas < 1 {
		return fmt.Errorf("dataset: %w: %d local replicas, expected at least 1", ErrInvalidArgument, localReplicas)
	}
	return nil
}

// Distribute divides ds, a dataset batched by the GLOBAL batch size, among
// the workers and local replicas of a synchronous job. ictx describes the
// job: NumInputPipelines workers, this worker's InputPipelineID, and
// NumReplicasInSync replicas in all, which must be localReplicas on each
// worker (NumReplicasInSync == localReplicas × NumInputPipelines).
//
// The global batch must divide by NumReplicasInSync (ErrNotDivisible
// otherwise); each replica of a full step then gets global /
// NumReplicasInSync examples. The data is divided among workers by the
// shard policy (WithShardPolicy, ShardAuto by default), and each worker's
// share is split among its replicas along the first dimension: contiguous
// rows, as views of the batch's memory, copied once into each replica's
// tensor. A partial batch is split as evenly as possible (counts differ by
// at most one), with its counts reported in Batch.
//
// Distribute works on a copy of ds's pipeline (fresh shuffle and cache
// state), so several Distributed values of one dataset, like the workers of
// a test, do not disturb each other.
func Distribute(ds Dataset, ictx InputContext, localReplicas int, opts ...DistributeOption) (*Distributed, error) {
	if err := checkReplicas(ictx, localReplicas); err != nil {
		return nil, err
	}
	W := ictx.NumInputPipelines
	if ictx.NumReplicasInSync != localReplicas*W {
		return nil, fmt.Errorf("dataset: Distribute: %w: %d replicas in sync, expected %d local replicas × %d workers = %d (use DistributeFromFunction when workers step independently)",
			ErrInvalidArgument, ictx.NumReplicasInSync, localReplicas, W, localReplicas*W)
	}
	if err := Err(ds); err != nil {
		return nil, err
	}
	if ds == nil {
		return nil, fmt.Errorf("dataset: Distribute: %w: nil Dataset", ErrInvalidArgument)
	}
	cfg := newDistConfig(opts)
	log := cfg.log.With(zap.Int("worker", ictx.InputPipelineID))
	ds = rebuild(pipeline(ds), nil)

	chain := pipeline(ds)
	bi := findBatch(chain)
	global := cfg.global
	variable := findSample(chain)
	if variable && global != 0 {
		return nil, fmt.Errorf("dataset: Distribute: %w: WithGlobalBatchSize(%d), but the dataset's batches are Poisson samples, of varying size", ErrInvalidArgument, global)
	}
	if bi >= 0 {
		size := chain[bi].(batcher).batchSize()
		if global != 0 && global != size {
			return nil, fmt.Errorf("dataset: Distribute: %w: WithGlobalBatchSize(%d), but the dataset is batched by %d", ErrInvalidArgument, global, size)
		}
		global = size
	}
	if global != 0 {
		if _, err := ictx.PerReplicaBatchSize(global); err != nil {
			return nil, fmt.Errorf("dataset: Distribute: %w", err)
		}
	}

	policy := cfg.policy
	if W == 1 {
		policy = ShardOff // one pipeline: nothing to divide
	}
	switch policy {
	case ShardAuto, ShardFile:
		sharded, err := shardByFile(chain, bi, ictx)
		switch {
		case err == nil:
			ds, policy = sharded, ShardFile
		case policy == ShardFile:
			return nil, fmt.Errorf("dataset: Distribute: FILE sharding: %w", err)
		default:
			log.Info("AUTO sharding falls back to DATA", zap.String("reason", err.Error()))
			policy = ShardData
		}
	case ShardData, ShardOff, ShardBatch:
	default:
		return nil, fmt.Errorf("dataset: Distribute: %w: shard policy %v", ErrInvalidArgument, policy)
	}
	d := &Distributed{ds: ds, policy: policy, ictx: ictx, local: localReplicas, global: global, variable: variable, cfg: cfg}
	d.cfg.log = log
	log.Info("distributed dataset",
		zap.Stringer("policy", policy), zap.Int("workers", W), zap.Int("replicas_in_sync", ictx.NumReplicasInSync),
		zap.Int("local_replicas", localReplicas), zap.Int("global_batch", global))
	return d, nil
}

// DistributeFromFunction builds this worker's input pipeline by calling fn
// once with ictx, as tf.distribute's distribute_datasets_from_function does
// (one call per worker: InputPipelineID is the worker's index). fn shards
// the data as it sees fit (for example Shard or ShardFiles by
// ictx.InputPipelineID) and batches by the PER-REPLICA batch size
// (ictx.PerReplicaBatchSize). Each step deals the next localReplicas batches
// of the dataset to the local replicas in order; when the data runs out
// mid-step, the remaining replicas get empty batches (Counts 0).
//
// ictx.NumReplicasInSync must be a multiple of localReplicas: localReplicas ×
// workers for a synchronous job, or localReplicas when each worker steps on
// its own (parameter servers).
func DistributeFromFunction(fn func(InputContext) (Dataset, error), ictx InputContext, localReplicas int, opts ...DistributeOption) (*Distributed, error) {
	const name = "DistributeFromFunction"
	cfg, err := checkFromFunction(name, fn, ictx, localReplicas, opts)
	if err != nil {
		return nil, err
	}
	ds, err := callFunction(name, fn, ictx)
	if err != nil {
		return nil, err
	}
	cfg.log = cfg.log.With(zap.Int("worker", ictx.InputPipelineID))
	return &Distributed{ds: ds, policy: ShardOff, ictx: ictx, local: localReplicas, global: cfg.global, fromFn: true, cfg: cfg}, nil
}

// DistributePerReplica builds one input pipeline per replica in sync, as
// tf.distribute's InputReplicationMode.PER_REPLICA does: it calls fn once
// for each of this worker's localReplicas replicas, the first of which
// has global id firstReplica, with the replica as the pipeline
// (NumInputPipelines and NumReplicasInSync the replicas in sync,
// InputPipelineID the replica's id). fn shards and batches as for
// DistributeFromFunction. Each step takes the next batch of every local
// replica's dataset; a replica whose dataset has ended gets empty batches
// until every one has. Replica g thus reads the same examples on any
// number of workers: what a job of virtual shards needs.
func DistributePerReplica(fn func(InputContext) (Dataset, error), ictx InputContext, localReplicas, firstReplica int, opts ...DistributeOption) (*Distributed, error) {
	const name = "DistributePerReplica"
	cfg, err := checkFromFunction(name, fn, ictx, localReplicas, opts)
	if err != nil {
		return nil, err
	}
	if firstReplica < 0 || firstReplica+localReplicas > ictx.NumReplicasInSync {
		return nil, fmt.Errorf("dataset: DistributePerReplica: %w: first replica %d of %d local replicas, expected 0 <= first <= %d (%d replicas in sync)",
			ErrInvalidArgument, firstReplica, localReplicas, ictx.NumReplicasInSync-localReplicas, ictx.NumReplicasInSync)
	}
	d := &Distributed{policy: ShardOff, ictx: ictx, local: localReplicas, global: cfg.global, fromFn: true, cfg: cfg}
	for r := range localReplicas {
		ds, err := callFunction(name, fn, InputContext{NumInputPipelines: ictx.NumReplicasInSync, InputPipelineID: firstReplica + r,
			NumReplicasInSync: ictx.NumReplicasInSync})
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", firstReplica+r, err)
		}
		d.perReplica = append(d.perReplica, ds)
	}
	d.cfg.log = cfg.log.With(zap.Int("worker", ictx.InputPipelineID))
	return d, nil
}

// checkFromFunction checks the arguments of DistributeFromFunction and
// DistributePerReplica, which name names in errors, and returns their
// options.
func checkFromFunction(name string, fn func(InputContext) (Dataset, error), ictx InputContext, localReplicas int, opts []DistributeOption) (distConfig, error) {
	if err := checkReplicas(ictx, localReplicas); err != nil {
		return distConfig{}, err
	}
	if ictx.NumReplicasInSync%localReplicas != 0 {
		return distConfig{}, fmt.Errorf("dataset: %s: %w: %d replicas in sync is not a multiple of %d local replicas",
			name, ErrInvalidArgument, ictx.NumReplicasInSync, localReplicas)
	}
	if fn == nil {
		return distConfig{}, fmt.Errorf("dataset: %s: %w: nil function", name, ErrInvalidArgument)
	}
	cfg := newDistConfig(opts)
	if cfg.global != 0 {
		if _, err := ictx.PerReplicaBatchSize(cfg.global); err != nil {
			return distConfig{}, fmt.Errorf("dataset: %s: %w", name, err)
		}
	}
	return cfg, nil
}

// callFunction returns fn's dataset for ictx, or why it has none, for
// the function name names.
func callFunction(name string, fn func(InputContext) (Dataset, error), ictx InputContext) (Dataset, error) {
	ds, err := fn(ictx)
	if err != nil {
		return nil, fmt.Errorf("dataset: %s: dataset function: %w", name, err)
	}
	if ds == nil {
		return nil, fmt.Errorf("dataset: %s: %w: the dataset function returned a nil Dataset", name, ErrInvalidArgument)
	}
	if err := Err(ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// Policy returns the shard policy in effect: ShardAuto resolved to FILE or
// DATA, and OFF for a single worker (there is nothing to divide) or a
// dataset built by DistributeFromFunction (its function shards).
func (d *Distributed) Policy() ShardPolicy { return d.policy }

// InputContext returns the job's input context.
func (d *Distributed) InputContext() InputContext { return d.ictx }

// Iterator starts a pass. ctx bounds the pass's lifetime, and its prefetch
// goroutine's.
func (d *Distributed) Iterator(ctx context.Context) (*DistIterator, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var st stepper
	if d.fromFn {
		f, err := openFnStepper(ctx, d)
		if err != nil {
			return nil, err
		}
		st = f
	} else {
		up, err := openHost(ctx, d.ds)
		if err != nil {
			return nil, err
		}
		st = &globalStepper{d: d, up: up, nominal: d.global}
	}
	it := &DistIterator{st: st, stage: d.cfg.stage, uneven: d.uneven(), local: d.local}
	if d.cfg.prefetch > 0 {
		it.pump = startPump(ctx, d.cfg.prefetch, it.produce)
	}
	return it, nil
}

// All returns the steps of one pass as a Go iterator. A failure is yielded
// once, with a nil Batch, and ends the sequence; breaking out of the loop
// ends the pass and releases its goroutine.
func (d *Distributed) All(ctx context.Context) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		it, err := d.Iterator(ctx)
		if err != nil {
			yield(nil, err)
			return
		}
		defer it.Close()
		for {
			b, err := it.Next(ctx)
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(b, nil) {
				return
			}
		}
	}
}

// DistIterator yields the steps of one pass over a Distributed dataset. It
// is not safe for concurrent use.
type DistIterator struct {
	st     stepper
	stage  StageFunc
	pump   *pump[*Batch]
	s      sticky
	closed bool

	// A pass whose workers must agree on its end looks one batch ahead.
	uneven   bool
	local    int
	last     *Batch
	peeked   *Batch
	localEnd bool
	failed   error // the input's error, carried by the last batch
}

func (it *DistIterator) produce(ctx context.Context) (*Batch, error) {
	b, err := it.st.nextStep(ctx)
	if err != nil {
		return nil, err
	}
	if it.stage != nil {
		if err := it.stage(ctx, b); err != nil {
			return nil, fmt.Errorf("dataset: stage step %d: %w", b.Step, err)
		}
	}
	return b, nil
}

// Next returns the next step's batch, or io.EOF after the last. It honours
// ctx while it waits. After an error other than ctx's own, every later call
// returns the same error. In a pass whose workers may run out of input at
// different steps (see Batch.NeedsAgreement), a worker whose input has
// ended gets padding batches until no worker has data.
func (it *DistIterator) Next(ctx context.Context) (*Batch, error) {
	if it.closed {
		return nil, errClosed
	}
	asked := time.Now()
	next := it.next
	if it.uneven {
		next = it.agreedNext
	}
	b, err := next(ctx)
	if b != nil {
		b.asked, b.got = asked, time.Now()
	}
	return b, err
}

// next returns the next batch of this worker's input.
func (it *DistIterator) next(ctx context.Context) (*Batch, error) {
	if it.pump != nil {
		return it.pump.next(ctx)
	}
	if it.s.err != nil {
		return nil, it.s.err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := it.produce(ctx)
	if err != nil {
		return nil, it.s.fail(ctx, err)
	}
	return b, nil
}

// Close ends the pass and waits for its goroutine. It may be called more
// than once.
func (it *DistIterator) Close() error {
	if it.closed {
		return nil
	}
	it.closed = true
	if it.pump != nil {
		it.pump.stop()
	}
	return it.st.close()
}

type stepper interface {
	nextStep(ctx context.Context) (*Batch, error)
	close() error
}

// batchRows returns the common first dimension of e's values.
func batchRows(e hostElem) (int, error) {
	n := -1
	for _, c := range e.cols {
		if len(c.shape) == 0 {
			return 0, fmt.Errorf("%w: feature %q is a scalar, expected a batch (is the dataset batched?)", ErrShape, c.name)
		}
		if n >= 0 && int(c.shape[0]) != n {
			return 0, fmt.Errorf("%w: feature %q has %d rows, expected %d like the other features", ErrShape, c.name, c.shape[0], n)
		}
		n = int(c.shape[0])
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: an element with no values", ErrShape)
	}
	return n, nil
}

// evenSplit returns the bounds of n items split into k contiguous parts as
// evenly as possible, the first n mod k parts one larger.
func evenSplit(n, k int) []int {
	b := make([]int, k+1)
	for i := range k {
		size := n / k
		if i < n%k {
			size++
		}
		b[i+1] = b[i] + size
	}
	return b
}

// split builds the per-replica elements of the selected rows of e:
// rows [lo, hi) when idx is nil, else the rows idx (gathered into one copy).
// Replica r gets the contiguous part r of the selection, as tensors created
// from views of the host data.
func split(e hostElem, lo, hi int, idx []int, replicas int) ([]Element, []int, error) {
	count := hi - lo
	if idx != nil {
		count = len(idx)
	}
	bounds := evenSplit(count, replicas)
	out := make([]Element, replicas)
	counts := make([]int, replicas)
	for r := range out {
		out[r] = make(Element, len(e.cols))
		counts[r] = bounds[r+1] - bounds[r]
	}
	for _, c := range e.cols {
		name := c.name
		k, err := kindFor(c.dtype)
		if err != nil {
			return nil, nil, fmt.Errorf("feature %q: %w", name, err)
		}
		n := int(c.shape[0])
		rowShape := c.shape[1:]
		if c.t != nil && replicas == 1 && idx == nil && lo == 0 && hi == n {
			out[0][name] = c.t // the whole tensor, as it came
			continue
		}
		data, err := c.view()
		if err != nil {
			return nil, nil, fmt.Errorf("feature %q: %w", name, err)
		}
		rowSize := int(numElements(rowShape))
		base := lo
		if idx != nil {
			data, base = k.gatherRows(data, idx, rowSize), 0
		}
		for r := range out {
			a, b := base+bounds[r], base+bounds[r+1]
			shape := make([]int64, 0, len(c.shape))
			shape = append(shape, int64(b-a))
			shape = append(shape, rowShape...)
			t, err := k.toTensor(k.sliceData(data, a*rowSize, b*rowSize), shape)
			if err != nil {
				return nil, nil, fmt.Errorf("feature %q: replica %d: %w", name, r, err)
			}
			out[r][name] = t
		}
	}
	return out, counts, nil
}

// globalStepper steps through a dataset of global batches (or, under FILE
// sharding, of per-worker batches).
type globalStepper struct {
	d       *Distributed
	up      hostIter
	nominal int   // the global batch size; 0 until the first batch when inferred
	seen    int64 // examples of the pass so far (DATA sharding)
	offCur  hostElem
	offB    []int // OFF sharding: chunk bounds of offCur among workers
	offNext int
	step    int
	s       sticky
}

func (g *globalStepper) nextStep(ctx context.Context) (*Batch, error) {
	if g.s.err != nil {
		return nil, g.s.err
	}
	b, err := g.step1(ctx)
	if err != nil {
		return nil, g.s.fail(ctx, err)
	}
	b.Step = g.step
	g.step++
	if b.LocalCount() < g.perWorkerFull() {
		g.d.cfg.log.Debug("partial step", zap.Int("step", b.Step), zap.Ints("counts", b.Counts),
			zap.Int("global_count", b.GlobalCount), zap.Bool("exact", b.GlobalCountExact))
	}
	return b, nil
}

func (g *globalStepper) perWorkerFull() int { return g.nominal / g.d.ictx.NumInputPipelines }

func (g *globalStepper) step1(ctx context.Context) (*Batch, error) {
	d := g.d
	W, w := d.ictx.NumInputPipelines, d.ictx.InputPipelineID
	if d.policy == ShardOff && W > 1 && g.offNext < W && g.offB != nil {
		return g.offStep()
	}
	e, err := g.up.next(ctx)
	if err != nil {
		return nil, err
	}
	n, err := batchRows(e)
	if err != nil {
		return nil, fmt.Errorf("dataset: step %d: %w", g.step, err)
	}
	if !d.variable { // a Poisson sample may have any size
		if err := g.checkSize(n); err != nil {
			return nil, err
		}
	}
	switch {
	case W == 1:
		defer e.giveBack()
		return g.batch(e, 0, n, nil, n, true)
	case d.policy == ShardData:
		defer e.giveBack()
		return g.dataShare(e, n, W, w)
	case d.policy == ShardBatch:
		defer e.giveBack()
		parts := evenSplit(n, W*d.local)
		return g.batch(e, parts[w*d.local], parts[(w+1)*d.local], nil, n, true)
	case d.policy == ShardFile:
		defer e.giveBack()
		return g.batch(e, 0, n, nil, n+(W-1)*(g.nominal/W), false)
	default: // ShardOff: the global batch becomes W consecutive steps
		g.offCur, g.offB, g.offNext = e, evenSplit(n, W), 0
		return g.offStep()
	}
}

// checkSize infers the nominal global batch from the first one and
// refuses a batch larger than it.
func (g *globalStepper) checkSize(n int) error {
	d := g.d
	W := d.ictx.NumInputPipelines
	if g.nominal == 0 {
		if _, err := d.ictx.PerReplicaBatchSize(n); err != nil {
			return fmt.Errorf("dataset: global batch inferred from the first batch: %w (state it with WithGlobalBatchSize if that batch was partial)", err)
		}
		g.nominal = n
	}
	limit := g.nominal
	if d.policy == ShardFile {
		limit = g.nominal / W
	}
	if n > limit {
		return fmt.Errorf("dataset: step %d: %w: batch of %d examples, expected at most %d", g.step, ErrShape, n, limit)
	}
	return nil
}

// dataShare returns this worker's share of global batch e of n examples
// under DATA sharding: the examples i of the pass with i mod W == w.
func (g *globalStepper) dataShare(e hostElem, n, W, w int) (*Batch, error) {
	idx := []int{}
	for j := range n {
		if (g.seen+int64(j))%int64(W) == int64(w) {
			idx = append(idx, j)
		}
	}
	g.seen += int64(n)
	return g.batch(e, 0, 0, idx, n, true)
}

func (g *globalStepper) offStep() (*Batch, error) {
	j := g.offNext
	g.offNext++
	lo, hi := g.offB[j], g.offB[j+1]
	b, err := g.batch(g.offCur, lo, hi, nil, g.d.ictx.NumInputPipelines*(hi-lo), true)
	if g.offNext == len(g.offB)-1 {
		g.offCur.giveBack()
		g.offCur, g.offB = hostElem{}, nil
	}
	return b, err
}

func (g *globalStepper) batch(e hostElem, lo, hi int, idx []int, global int, exact bool) (*Batch, error) {
	reps, counts, err := split(e, lo, hi, idx, g.d.local)
	if err != nil {
		return nil, fmt.Errorf("dataset: step %d: %w", g.step, err)
	}
	return &Batch{Replicas: reps, Counts: counts, GlobalCount: global, GlobalCountExact: exact}, nil
}

func (g *globalStepper) close() error { return g.up.close() }

// fnStepper deals the per-replica batches of a DistributeFromFunction
// dataset to the local replicas.
type fnStepper struct {
	d       *Distributed
	ups     []hostIter // the dataset's, or each local replica's
	ended   []bool
	maxRows int
	step    int
	s       sticky
}

// openFnStepper starts d's dataset, or each of its replicas' datasets.
func openFnStepper(ctx context.Context, d *Distributed) (*fnStepper, error) {
	dss := d.perReplica
	if dss == nil {
		dss = []Dataset{d.ds}
	}
	ups, err := openHosts(ctx, dss)
	if err != nil {
		return nil, err
	}
	return &fnStepper{d: d, ups: ups, ended: make([]bool, len(dss))}, nil
}

func (f *fnStepper) nextStep(ctx context.Context) (*Batch, error) {
	if f.s.err != nil {
		return nil, f.s.err
	}
	batches, err := f.take(ctx)
	if err != nil {
		return nil, f.s.fail(ctx, err)
	}
	if batches == nil {
		f.s.err = io.EOF
		return nil, io.EOF
	}
	b, err := f.build(batches)
	for _, e := range batches {
		if e != nil {
			e.giveBack()
		}
	}
	if err != nil {
		f.s.err = err
		return nil, err
	}
	b.Step = f.step
	f.step++
	return b, nil
}

// take returns the step's batch of each local replica, nil for a replica
// that has none: the next batches of the one dataset, in replica order,
// or the next of each replica's own. It returns nil when none has any.
func (f *fnStepper) take(ctx context.Context) ([]*hostElem, error) {
	batches := make([]*hostElem, f.d.local)
	found := false
	for r := range batches {
		u := min(r, len(f.ups)-1)
		if f.ended[u] {
			continue
		}
		e, err := f.ups[u].next(ctx)
		if err == io.EOF {
			f.ended[u] = true
			continue
		}
		if err != nil {
			for _, b := range batches {
				if b != nil {
					b.giveBack()
				}
			}
			return nil, err
		}
		batches[r], found = &e, true
	}
	if !found {
		return nil, nil
	}
	return batches, nil
}

func (f *fnStepper) build(batches []*hostElem) (*Batch, error) {
	d := f.d
	R, N := d.local, d.ictx.NumReplicasInSync
	perReplica := 0
	if d.global != 0 {
		perReplica = d.global / N
	}
	var some hostElem
	for _, e := range batches {
		if e != nil {
			some = *e
			break
		}
	}
	b := &Batch{Replicas: make([]Element, R), Counts: make([]int, R)}
	for r, e := range batches {
		var err error
		if e == nil {
			b.Replicas[r], err = emptyLike(some)
		} else {
			b.Replicas[r], b.Counts[r], err = f.replicaBatch(*e, perReplica)
		}
		if err != nil {
			return nil, fmt.Errorf("dataset: step %d, replica %d: %w", f.step, r, err)
		}
	}
	local := b.LocalCount()
	if N == R {
		b.GlobalCount, b.GlobalCountExact = local, true
	} else {
		if perReplica == 0 {
			perReplica = f.maxRows
		}
		b.GlobalCount = local + (N-R)*perReplica
	}
	return b, nil
}

// replicaBatch returns e as a replica's batch and its examples, which
// must be at most perReplica when it is not 0.
func (f *fnStepper) replicaBatch(e hostElem, perReplica int) (Element, int, error) {
	n, err := batchRows(e)
	if err != nil {
		return nil, 0, err
	}
	if perReplica != 0 && n > perReplica {
		return nil, 0, fmt.Errorf("%w: batch of %d examples, expected at most the per-replica batch %d (global %d / %d replicas)",
			ErrShape, n, perReplica, f.d.global, f.d.ictx.NumReplicasInSync)
	}
	reps, counts, err := split(e, 0, n, nil, 1)
	if err != nil {
		return nil, 0, err
	}
	f.maxRows = max(f.maxRows, n)
	return reps[0], counts[0], nil
}

// emptyLike returns tensors of e's dtypes and row shapes with no rows.
func emptyLike(e hostElem) (Element, error) {
	out := make(Element, len(e.cols))
	for _, c := range e.cols {
		name := c.name
		k, err := kindFor(c.dtype)
		if err != nil {
			return nil, err
		}
		shape := append([]int64{0}, c.shape[1:]...)
		t, err := k.toTensor(k.makeSlice(0), shape)
		if err != nil {
			return nil, fmt.Errorf("feature %q: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

func (f *fnStepper) close() error { return closeHosts(f.ups) }
