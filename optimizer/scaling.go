package optimizer

import (
	"errors"
	"fmt"
	"math"
)

// ScaleLR applies the linear scaling rule (Goyal et al., 2017): a learning
// rate base tuned for batches of baseBatch examples becomes
// base·globalBatch/baseBatch for batches of globalBatch examples. Combine
// it with a Warmup, which the rule needs for large batches.
func ScaleLR(base float32, baseBatch, globalBatch int) (float32, error) {
	var errs []error
	errs = append(errs, nonNegative("base learning rate", base))
	if baseBatch < 1 {
		errs = append(errs, fmt.Errorf("base batch size is %d, want >= 1", baseBatch))
	}
	if globalBatch < 1 {
		errs = append(errs, fmt.Errorf("global batch size is %d, want >= 1", globalBatch))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("linear scaling rule: %w", err)
	}
	lr := float64(base) * float64(globalBatch) / float64(baseBatch)
	if lr > math.MaxFloat32 {
		return 0, fmt.Errorf("linear scaling rule: %v·%d/%d overflows float32", base, globalBatch, baseBatch)
	}
	return float32(lr), nil
}

// ReplicaCounter is what ScaleLRToReplicas reads of a synchronous strategy:
// strategy.Strategy and strategy.Scope are ones.
type ReplicaCounter interface {
	// NumReplicasInSync returns the number of replicas across all workers.
	NumReplicasInSync() int
}

// ScaleLRToReplicas is ScaleLR for a synchronous strategy whose replicas
// each take perReplicaBatch examples: the global batch is
// perReplicaBatch·r.NumReplicasInSync(). Under the parameter-server
// strategy each worker's update takes only its own batch: use ScaleLR with
// the worker's batch there.
func ScaleLRToReplicas(base float32, baseBatch, perReplicaBatch int, r ReplicaCounter) (float32, error) {
	if perReplicaBatch < 1 {
		return 0, fmt.Errorf("linear scaling rule: per-replica batch size is %d, want >= 1", perReplicaBatch)
	}
	n := r.NumReplicasInSync()
	if n < 1 {
		return 0, fmt.Errorf("linear scaling rule: the strategy has %d replicas in sync, want >= 1", n)
	}
	return ScaleLR(base, baseBatch, perReplicaBatch*n)
}
