package strategy

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// This file is the contract between model code and the strategies: the
// interfaces that layers, losses and optimizers use, which every strategy
// implements — the in-graph engine behind the default strategy, Mirrored
// and MultiWorkerMirrored, and the parameter-server strategy. Model code
// written against them trains under any strategy unchanged.

// Variable is one logical model variable created in a strategy's Scope.
// However the strategy stores it (a copy per replica, shards on ps tasks),
// model code sees one variable with one name, type and shape.
type Variable interface {
	// Name returns the variable's unique name, also its checkpoint key.
	Name() string
	// DType returns the element type.
	DType() tf.DataType
	// Shape returns the shape.
	Shape() []int64
	// Trainable reports whether optimizers train the variable.
	Trainable() bool
	// Synchronization returns when the strategy keeps its copies in sync.
	Synchronization() Synchronization
	// Aggregation returns how replicas' writes are combined.
	Aggregation() Aggregation
}

// Scope creates variables the strategy's way. Strategy.Scope passes one to
// its function; it is valid only until that function returns.
type Scope interface {
	// Variable creates a variable named name (unique within the strategy)
	// of the given type and shape, initialised from one value built by
	// init.
	Variable(name string, dtype tf.DataType, shape []int64, init Initializer, opts ...VariableOption) (Variable, error)
	// NumReplicasInSync returns the number of replicas of the strategy.
	NumReplicasInSync() int
}

// Replica is what a step function sees while a strategy traces it for one
// replica (one device of a synchronous strategy, one worker of the
// parameter-server strategy).
//
// Cross-replica calls (AllReduce, AllGather, Minimize, Assign of an OnWrite
// variable) are merge points under synchronous strategies: every replica
// must make the same ones in the same order.
type Replica interface {
	// Scope returns a graph scope pinned to the replica's device. Ops built
	// on it need names of their own: use Scope().SubScope, or an nn.Builder.
	Scope() *op.Scope
	// ReplicaID returns the replica's id among all replicas in sync; under
	// the parameter-server strategy, the index of its worker.
	ReplicaID() int
	// NumReplicasInSync returns the number of replicas whose gradients one
	// update combines (tf.distribute's num_replicas_in_sync): every
	// replica of every worker under a synchronous strategy, 1 under the
	// parameter-server strategy, whose workers each apply their own.
	NumReplicasInSync() int
	// Read returns the value of v as this step sees it; every Read of v in
	// one step gives the same tensor.
	Read(v Variable) (tf.Output, error)
	// Lookup returns the rows of v that ids (int32 or int64, any shape)
	// name: shape ids.shape + v.shape[1:]. An id out of range fails the
	// step naming it.
	Lookup(v Variable, ids tf.Output) (tf.Output, error)
	// AverageLoss returns the sum of every element of perExample divided
	// by the number of examples whose gradients one update combines (0
	// when there are none): under a synchronous strategy the examples of
	// the global step, the sum of every replica's batch (the leading
	// dimension of the step's first input by name; RunReplicas's
	// globalCount), a partial last batch counted as it is; under the
	// parameter-server strategy the worker's batch, the leading dimension
	// of its first input. It is tf.nn.compute_average_loss with
	// global_batch_size set to that count, so it is the mean only when
	// perExample holds one value per example: for a per-token loss it is
	// the tokens per example times the mean per token. It is not
	// tf.nn.compute_average_loss with its default divisor, which is
	// nn.ComputeAverageLoss; nn.ReduceLoss reduces as Keras's losses do.
	AverageLoss(perExample tf.Output) tf.Output
	// Minimize computes the gradients of loss with respect to vars and
	// applies them with opt, as opts (WithSparseOptimizer,
	// WithAccumulation) say.
	Minimize(opt Optimizer, loss tf.Output, vars []Variable, opts ...MinimizeOption) error
	// Gradients returns the gradients of loss with respect to vars, one of
	// each variable's shape (tf.GradientTape.gradient): Minimize's first
	// half, for a step that changes the gradients before it applies them.
	// A looked-up variable's gradient is zero outside the rows looked up.
	// Under a synchronous strategy the gradient passes through an
	// AllReduce the loss depends on, as tf.distribute's does.
	Gradients(loss tf.Output, vars []Variable) ([]tf.Output, error)
	// ApplyGradients applies grads, one per variable of its shape, with
	// opt (optimizer.apply_gradients): Minimize's second half. A
	// synchronous strategy sums them across the replicas first.
	ApplyGradients(opt Optimizer, grads []tf.Output, vars []Variable, opts ...MinimizeOption) error
	// AllReduce combines value across all replicas in sync. A strategy
	// whose replicas do not run in sync returns an error.
	AllReduce(red ReduceOp, value tf.Output) (tf.Output, error)
	// AllGather concatenates value from all replicas along axis 0 (so
	// value has rank 1 or more). A strategy whose replicas do not run in
	// sync returns an error.
	AllGather(value tf.Output) (tf.Output, error)
	// Assign writes value to v from inside the replica, with
	// tf.distribute's rules for the variable's synchronization and
	// aggregation.
	Assign(v Variable, value tf.Output) error
	// AssignAdd adds value to v, with Assign's rules.
	AssignAdd(v Variable, value tf.Output) error
	// AddTarget makes o run every step (a metric update, say).
	AddTarget(o *tf.Operation)
	// ReduceOutput declares an output of the step, named name, that is
	// value combined across all replicas in sync by red: summed, or
	// averaged over NumReplicasInSync. It is computed and fetched in the
	// step's own run — no Reduce after it — and the run's Result holds it
	// as one tensor (Result.Reduced). Every replica must declare the same
	// reduced outputs, and name must differ from the outputs the step
	// function returns. Under the parameter-server strategy, whose workers
	// do not run in sync, the output is the worker's own value.
	ReduceOutput(name string, red ReduceOp, value tf.Output) error
}

// ReplicaFn is a training or evaluation step written for one replica. Build
// calls it once per local replica, with inputs of that replica's shape; it
// returns the tensors to fetch each step. The same function builds the step
// of every strategy.
type ReplicaFn func(r Replica, in Inputs) (Outputs, error)

// ApplyContext gives an Optimizer what it needs to update one copy of the
// variables: a scope on their device, their handles, and slot variables
// that follow them. Each strategy implements it.
type ApplyContext interface {
	// Scope returns the scope the update ops go on.
	Scope() *op.Scope
	// Handle returns the resource handle of the copy of v being updated.
	Handle(v Variable) tf.Output
	// Slot returns the slot variable named slot that owner (an
	// optimizer's name) keeps for v, of v's type and shape, creating it
	// with init on first use; it is checkpointed as "<v>/<owner>/<slot>".
	Slot(owner string, v Variable, slot string, init Initializer) (Variable, error)
	// NonSlot returns a variable owner keeps once rather than per variable
	// (its step count, say), named "<owner>/<name>", creating it on first
	// use.
	NonSlot(owner, name string, dtype tf.DataType, shape []int64, init Initializer) (Variable, error)
}

// ShardedApply is the ApplyContext of a strategy that shards optimizer
// state across its workers (multiworker.WithZeRO): the variables Apply is
// given are this worker's shards of the trained variables, vectors of some
// of their elements (possibly none) named as the whole variables are, and
// their slots are shards too. An update that is elementwise needs nothing
// more; one that needs a quantity of a whole variable or of every
// gradient (a norm) sums each worker's part of it with SumShards, which
// every worker must call alike, in the same order.
type ShardedApply interface {
	ApplyContext
	// SumShards returns x summed across the workers, on s's device.
	SumShards(s *op.Scope, x tf.Output) (tf.Output, error)
	// Whole returns the shape of the variable v is a shard of, and the
	// place of v's first element in the whole variable's flattening.
	Whole(v Variable) (shape []int64, lo int64)
	// WholeValue returns, on s, the value before the update of the whole
	// variable v is a shard of, which every worker holds.
	WholeValue(s *op.Scope, v Variable) tf.Output
}

// Optimizer applies reduced gradients to one copy of variables. Package
// optimizer has SGD, Momentum, Adam, AdamW, LARS and LAMB.
type Optimizer interface {
	// Apply builds, on ac's scope, the ops that apply grads to the copies
	// of vars that ac addresses, and returns one op that runs them all. A
	// synchronous strategy calls it once per replica with the same vars.
	Apply(ac ApplyContext, grads []tf.Output, vars []Variable) (*tf.Operation, error)
}

// LossScaler is an Optimizer that scales the loss (optimizer.LossScale):
// Minimize multiplies the loss by the factor LossScale returns before it
// differentiates it, so that small gradients of 16-bit computations do not
// underflow, and the optimizer's Apply divides the gradients by the same
// factor. The parameter-server strategy, whose workers apply their
// updates asynchronously, refuses one, as tf.distribute does.
type LossScaler interface {
	Optimizer
	// LossScale builds, on ac's scope, the float32 scalar factor of the
	// loss for the replica whose copies ac addresses.
	LossScale(ac ApplyContext) (tf.Output, error)
}

// PrivateOptimizer is an Optimizer for differentially private SGD
// (optimizer.DPSGD). Minimize takes its loss as one value per example of
// the replica's batch (unscaled), differentiates each example's loss on
// its own, has ClipExample clip each example's gradients, and sums the
// clipped gradients over the replica's examples; the engine sums them
// across all replicas, and Apply adds the noise, once per global step, and
// divides by the expected batch. The parameter-server strategy refuses
// one: its workers update asynchronously, which the privacy accounting
// does not cover.
type PrivateOptimizer interface {
	Optimizer
	// MaxExamples is the most examples one replica's batch may hold: the
	// number of per-example gradients the step builds. A batch with more
	// fails the step.
	MaxExamples() int
	// ClipExample builds, on s, one example's gradients clipped as the
	// optimizer's privacy requires.
	ClipExample(s *op.Scope, grads []tf.Output) []tf.Output
}

// SparseOptimizer updates only the rows of a variable that a step looked up
// (Replica.Lookup), where the strategy moves rows rather than whole
// variables: the parameter-server strategy.
type SparseOptimizer interface {
	// ApplySparse builds, on s (pinned to the device of the variable's
	// shard), the update of the rows indices (int64) of the shard handle
	// with their gradient rows values; an index may repeat, and its
	// gradients then add up.
	ApplySparse(s *op.Scope, handle, indices, values tf.Output, dtype tf.DataType) (*tf.Operation, error)
}

// MinimizeOption configures Replica.Minimize.
type MinimizeOption func(*MinimizeConfig)

// MinimizeConfig is what MinimizeOptions set; strategies read it with
// NewMinimizeConfig.
type MinimizeConfig struct {
	// Sparse updates the variables a step looked up, where the strategy
	// updates rows (the parameter-server strategy). Synchronous strategies
	// differentiate lookups densely and apply the Optimizer.
	Sparse SparseOptimizer
	// Accumulation is the number of micro-steps whose gradients one update
	// applies (WithAccumulation); 1 applies every step's.
	Accumulation int
}

// WithSparseOptimizer sets how a strategy that updates rows (the
// parameter-server strategy) updates the variables a step looked up: only
// the rows looked up, with o. Without it, such a strategy updates them
// whole with Minimize's optimizer, from gradients that are zero outside the
// rows looked up. Synchronous strategies ignore it.
func WithSparseOptimizer(o SparseOptimizer) MinimizeOption {
	return func(c *MinimizeConfig) { c.Sparse = o }
}

// WithAccumulation makes the step accumulate gradients over k runs
// (micro-steps) and apply them once: runs 1 to k-1 add each replica's
// gradients to accumulators on its device without communicating, and run k
// adds its own, all-reduces the sums once and applies them. The update
// equals one step on the k micro-batches together, the last one partial or
// not. Every Minimize of the step must give the same k. Only the in-graph
// engine (the default strategy, Mirrored, MultiWorkerMirrored)
// accumulates; the parameter-server strategy refuses the option when k > 1.
func WithAccumulation(k int) MinimizeOption {
	return func(c *MinimizeConfig) { c.Accumulation = k }
}

// NewMinimizeConfig applies opts, and returns an error naming the value
// that an option was given out of its range.
func NewMinimizeConfig(opts ...MinimizeOption) (MinimizeConfig, error) {
	c := MinimizeConfig{Accumulation: 1}
	for _, o := range opts {
		o(&c)
	}
	if c.Accumulation < 1 {
		return c, fmt.Errorf("WithAccumulation(%d): expected at least 1 micro-step per update", c.Accumulation)
	}
	return c, nil
}

// Partitioner decides how many shards a variable is split into along its
// first axis, as TensorFlow's variable partitioners do. Only the
// parameter-server strategy shards variables; the others keep each
// variable whole.
type Partitioner interface {
	// NumShards returns the number of shards of a variable of the given
	// shape and type.
	NumShards(shape []int64, dtype tf.DataType) (int, error)
}

// MustRead is r.Read(v) for model code that has checked its variables: it
// panics on an error (a variable of another strategy), and Build turns the
// panic into a build error.
func MustRead(r Replica, v Variable) tf.Output {
	out, err := r.Read(v)
	if err != nil {
		panic(err)
	}
	return out
}
