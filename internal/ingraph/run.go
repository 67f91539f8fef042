package ingraph

import (
	"context"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/strategy"
)

var _ strategy.Strategy = (*Engine)(nil)

// InputContext describes this process's input pipeline: the number of
// workers, this worker's index and the replicas in sync.
func (e *Engine) InputContext() dataset.InputContext {
	replicas := e.cfg.NumReplicasInSync
	if e.cfg.IndependentSteps {
		replicas *= e.cfg.NumWorkers
	}
	return dataset.InputContext{
		NumInputPipelines: e.cfg.NumWorkers,
		InputPipelineID:   e.cfg.WorkerID,
		NumReplicasInSync: replicas,
	}
}

// DistributeDataset divides ds, batched by the global batch size, among the
// workers (by the shard policy, AUTO by default) and splits each worker's
// share into per-replica batches. The global batch must divide by the
// number of replicas in sync. With virtual shards the policy is
// dataset.ShardBatch, and another one is an error.
func (e *Engine) DistributeDataset(ds dataset.Dataset, opts ...dataset.DistributeOption) (*dataset.Distributed, error) {
	if e.cfg.VirtualShards > 0 {
		opts = append([]dataset.DistributeOption{dataset.WithShardPolicy(dataset.ShardBatch)}, opts...)
	}
	d, err := dataset.Distribute(ds, e.InputContext(), e.NumLocalReplicas(), opts...)
	if err != nil {
		return nil, fmt.Errorf("strategy %s: %w", e.cfg.Name, err)
	}
	if p := d.Policy(); e.cfg.VirtualShards > 0 && e.cfg.NumWorkers > 1 && p != dataset.ShardBatch {
		return nil, fmt.Errorf("strategy %s: deterministic with %d virtual shards: shard policy %v gives a virtual shard other examples on other numbers of workers; expected the default, dataset.ShardBatch",
			e.cfg.Name, e.cfg.VirtualShards, p)
	}
	return d, nil
}

// DistributeDatasetsFromFunction calls fn once with this worker's
// InputContext; the dataset it returns must be batched by the per-replica
// batch size (InputContext.PerReplicaBatchSize). With virtual shards it
// calls fn once per local shard, with the shard as the input pipeline
// (dataset.DistributePerReplica), so that a function that shards by its
// InputContext gives a shard the same examples on every topology.
func (e *Engine) DistributeDatasetsFromFunction(fn func(dataset.InputContext) (dataset.Dataset, error), opts ...dataset.DistributeOption) (*dataset.Distributed, error) {
	var d *dataset.Distributed
	var err error
	if e.cfg.VirtualShards > 0 {
		d, err = dataset.DistributePerReplica(fn, e.InputContext(), e.NumLocalReplicas(), e.cfg.FirstReplicaID, opts...)
	} else {
		d, err = dataset.DistributeFromFunction(fn, e.InputContext(), e.NumLocalReplicas(), opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("strategy %s: %w", e.cfg.Name, err)
	}
	return d, nil
}

// Run runs step on one distributed batch: replica i gets batch.Replicas[i],
// and average losses divide by the examples in the whole global step. A
// replica with no examples whose element lacks an input (a padding batch,
// see dataset.Batch.NeedsAgreement) is fed that input with no rows. In a
// pass whose workers must agree on its end, the step's own run tells the
// batch whether any worker has another (Batch.Agree).
func (e *Engine) Run(ctx context.Context, s strategy.Step, batch *dataset.Batch) (strategy.Result, error) {
	step := e.stepOf(s)
	if batch == nil {
		return nil, fmt.Errorf("strategy: Run: nil batch")
	}
	if err := batch.Err(); err != nil {
		return nil, e.abortPeers(fmt.Errorf("strategy: Run: step %d: the input of worker %d failed: %w", batch.Step, e.cfg.WorkerID, err))
	}
	if batch.NeedsAgreement() && step != nil && (step.acc != nil || e.cfg.IndependentSteps) {
		what := "a step that accumulates gradients"
		if e.cfg.IndependentSteps {
			what = "a worker that steps independently (local SGD), which synchronises at the same steps as the others,"
		}
		return nil, fmt.Errorf("strategy: Run: %s cannot run a pass whose workers' inputs may end at different steps "+
			"(FILE sharding or DistributeDatasetsFromFunction over several workers): use DATA sharding", what)
	}
	feeds := make([]map[string]*tf.Tensor, len(batch.Replicas))
	for i, el := range batch.Replicas {
		feeds[i] = el
		if len(batch.Counts) > i && batch.Counts[i] == 0 && step != nil {
			var err error
			if feeds[i], err = step.withEmptyInputs(el); err != nil {
				return nil, fmt.Errorf("strategy: Run: replica %d: %w", i, err)
			}
		}
	}
	global := batch.GlobalCount
	if global <= 0 || e.cfg.IndependentSteps {
		global = batch.LocalCount()
	}
	res, more, err := e.runReplicas(ctx, step, feeds, max(global, 1), batch.HasNext(), fmt.Sprintf("step %d: ", batch.Step))
	if err == nil {
		batch.Agree(more)
	}
	return res, err
}

// abortPeers hands err to the peers waiting for this worker's step, when
// the strategy spans workers, and refuses every later run; it returns err.
func (e *Engine) abortPeers(err error) error {
	if e.cfg.AbortPeers == nil {
		return err
	}
	e.cfg.AbortPeers(err)
	err = fmt.Errorf("%w; %w", err, strategy.ErrCannotContinue)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed == nil {
		e.failed = err
	}
	return err
}
