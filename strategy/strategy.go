package strategy

import (
	"context"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
)

// Strategy is what a training program calls, whatever the distribution:
// the default strategy, mirrored.Strategy and multiworker.Strategy all
// implement it (each embeds the in-graph engine).
type Strategy interface {
	// Scope runs fn with a Scope that creates variables the strategy's way.
	// The in-graph strategies initialise them by the next call that takes
	// a context, so Scope never waits for peers.
	Scope(fn func(Scope) error) error
	// NumReplicasInSync returns the number of replicas across all workers.
	NumReplicasInSync() int
	// NumLocalReplicas returns the number of replicas in this process.
	NumLocalReplicas() int
	// InputContext describes this process's input pipeline.
	InputContext() dataset.InputContext
	// DistributeDataset divides a dataset batched by the global batch size
	// among the workers and replicas.
	DistributeDataset(ds dataset.Dataset, opts ...dataset.DistributeOption) (*dataset.Distributed, error)
	// DistributeDatasetsFromFunction builds one dataset per replica, each
	// batched by the per-replica batch size.
	DistributeDatasetsFromFunction(fn func(dataset.InputContext) (dataset.Dataset, error), opts ...dataset.DistributeOption) (*dataset.Distributed, error)
	// Build traces fn once per replica into a Step.
	Build(spec InputSpec, fn ReplicaFn) (Step, error)
	// Run runs a Step on one distributed batch.
	Run(ctx context.Context, step Step, batch *dataset.Batch) (Result, error)
	// Reduce combines a per-replica value across all replicas.
	Reduce(ctx context.Context, red ReduceOp, v PerReplica) (*tf.Tensor, error)
	// Gather concatenates a per-replica value along axis 0 across all
	// replicas (so its tensors have rank 1 or more).
	Gather(ctx context.Context, v PerReplica) (*tf.Tensor, error)
	// LocalResults returns the values of this process's replicas.
	LocalResults(v PerReplica) []*tf.Tensor
	// Value reads a variable outside any replica.
	Value(ctx context.Context, v Variable) (*tf.Tensor, error)
	// Variables returns every variable of the strategy.
	Variables() []Variable
	// Close releases the strategy's session.
	Close() error
}

// Step is a replica function a strategy traced into its graph for every
// replica (Build's result); Run executes it once per global batch.
type Step interface {
	// OutputNames returns the names of the step's outputs, sorted: the
	// keys of the Result a run returns, reduced outputs included.
	OutputNames() []string
	// ReducedOutputNames returns the names of the outputs the step
	// declared with Replica.ReduceOutput, sorted.
	ReducedOutputNames() []string
	// Accumulation returns the number of runs (micro-steps) whose
	// gradients one update of the step applies: its WithAccumulation, or 1.
	Accumulation() int
}
