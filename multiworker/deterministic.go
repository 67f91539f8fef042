package multiworker

import "fmt"

// WithDeterministic makes training topology-invariant: the job runs
// virtualShards replicas in sync whatever its workers and devices (each
// device runs virtualShards / (workers × devices) of them in one step,
// each its own kernels, all sharing the device's copy of every variable),
// each replica sees the same examples on every topology
// (dataset.ShardBatch), and every cross-replica sum adds the replicas'
// values along one tree. Two runs with the same seed and data then end
// with the same bits on 1, 2 or 4 workers of 1 or 2 devices, and under
// mirrored or one device with the same number of virtual shards.
//
// virtualShards must be a power of two that the replicas across workers
// divide. Only tfdist's engine sums in tree order: WithCommunication(Ring
// or NCCL), WithCompression and WithAggregation are errors with it. New
// also refuses workers whose kernels may round otherwise: another
// TensorFlow build, intra-op thread count, oneDNN setting or instruction
// set than a peer's; in an elastic job, a worker that differs from the
// one holding the job's state leaves it (ErrArithmeticMismatch). See
// docs/reproducibility.md for what it guarantees and what it costs.
func WithDeterministic(virtualShards int) Option {
	return func(c *config) { c.shards = virtualShards }
}

// checkDeterministic refuses what cannot sum in tree order.
func (c config) checkDeterministic() error {
	switch {
	case c.shards <= 0: // the engine refuses a negative count
		return nil
	case c.comm != Auto && c.comm != Engine:
		return fmt.Errorf("multiworker: WithDeterministic(%d) with WithCommunication(%v): only tfdist's engine sums in tree order; use Auto", c.shards, c.comm)
	case c.compression != None:
		return fmt.Errorf("multiworker: WithDeterministic(%d) with WithCompression(%v): compressed gradients are not the same bits on other topologies; use one or the other", c.shards, c.compression)
	case c.aggregation != nil:
		return fmt.Errorf("multiworker: WithDeterministic(%d) with WithAggregation(%s): a rule votes per worker, which changes with their number; use one or the other", c.shards, c.aggregation)
	}
	return nil
}
