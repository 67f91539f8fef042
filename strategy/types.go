package strategy

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// ReduceOp says how values from replicas are combined.
type ReduceOp int

const (
	// Sum adds the replicas' values.
	Sum ReduceOp = iota
	// Mean averages the replicas' values.
	Mean
)

// String returns "SUM" or "MEAN".
func (r ReduceOp) String() string {
	switch r {
	case Sum:
		return "SUM"
	case Mean:
		return "MEAN"
	}
	return fmt.Sprintf("ReduceOp(%d)", int(r))
}

// Synchronization says when the copies of a variable are kept in sync.
type Synchronization int

const (
	// OnWrite keeps every copy identical: every write is aggregated across
	// replicas and applied to every copy. The default, for model weights.
	OnWrite Synchronization = iota
	// OnRead lets each replica write its own copy; the copies are aggregated
	// when the variable is read outside a replica. For metrics.
	OnRead
)

// String returns the name of s.
func (s Synchronization) String() string {
	switch s {
	case OnWrite:
		return "ON_WRITE"
	case OnRead:
		return "ON_READ"
	}
	return fmt.Sprintf("Synchronization(%d)", int(s))
}

// Aggregation says how replicas' writes to a variable are combined.
type Aggregation int

const (
	// AggregationNone: replicas may not write the variable (OnWrite) or
	// reading it outside a replica is an error (OnRead).
	AggregationNone Aggregation = iota
	// AggregationSum adds the replicas' values.
	AggregationSum
	// AggregationMean averages the replicas' values.
	AggregationMean
	// AggregationOnlyFirstReplica takes replica 0's value.
	AggregationOnlyFirstReplica
)

// String returns the name of a.
func (a Aggregation) String() string {
	switch a {
	case AggregationNone:
		return "NONE"
	case AggregationSum:
		return "SUM"
	case AggregationMean:
		return "MEAN"
	case AggregationOnlyFirstReplica:
		return "ONLY_FIRST_REPLICA"
	}
	return fmt.Sprintf("Aggregation(%d)", int(a))
}

// TensorSpec describes one per-replica input of a Step: its type and shape,
// -1 for an unknown dimension (the batch dimension, usually).
type TensorSpec struct {
	DType tf.DataType
	Shape []int64
}

// Check reports how t, fed as the input named name, does not fit the spec:
// its dtype, or a dimension the spec fixes.
func (ts TensorSpec) Check(name string, t *tf.Tensor) error {
	if t.DataType() != ts.DType {
		return fmt.Errorf("input %q: dtype %s, expected %s", name, graphutil.DTypeName(t.DataType()), graphutil.DTypeName(ts.DType))
	}
	got := t.Shape()
	fits := len(got) == len(ts.Shape)
	for i := 0; fits && i < len(got); i++ {
		fits = ts.Shape[i] < 0 || got[i] == ts.Shape[i]
	}
	if !fits {
		return fmt.Errorf("input %q: shape %v, expected %v", name, got, ts.Shape)
	}
	return nil
}

// InputSpec names the inputs a Step takes.
type InputSpec map[string]TensorSpec

// Inputs are the per-replica input placeholders a replica function receives.
type Inputs map[string]tf.Output

// Outputs are what a replica function returns; Run fetches them per replica.
type Outputs map[string]tf.Output

// PerReplica holds one value per local replica, in replica order.
type PerReplica []*tf.Tensor

// Result maps each output name of a Step to its per-replica values, or,
// for an output declared with Replica.ReduceOutput, to its one reduced
// value (Result.Reduced).
type Result map[string]PerReplica

// ErrScopeClosed is returned when a Scope is used after its function returned.
var ErrScopeClosed = errors.New("strategy: scope used after Scope returned")

// ErrInScope is returned by a strategy's calls (Value, Run, Build, …) made
// while its Scope function runs: the variables it creates exist only once
// it returns, and the call would wait for it forever.
var ErrInScope = errors.New("called while the strategy's Scope function runs: its variables exist only once it returns; call after Scope")

// ErrCannotContinue is wrapped by a run error after which the strategy runs
// nothing more: a synchronous step that failed across workers (a dead or
// silent peer, a step past its deadline) may have left the workers' copies
// of the model in different states, and its collectives cannot be resumed.
// Every later run returns an error that wraps it too; Close still works.
// The job goes on by restarting every worker from its latest checkpoint
// (`tfdist launch --max-restarts`, or the cluster manager's restart policy).
var ErrCannotContinue = errors.New("the strategy cannot go on: restart every worker from the latest checkpoint")

// BuildError is an error found while building a Step: it names the replica
// (or -1 when the error is not a replica's) and wraps the cause.
type BuildError struct {
	Replica int
	Err     error
}

// Error describes the failure with its replica.
func (e *BuildError) Error() string {
	if e.Replica < 0 {
		return "strategy: build: " + e.Err.Error()
	}
	return fmt.Sprintf("strategy: build: replica %d: %v", e.Replica, e.Err)
}

// Unwrap returns the cause.
func (e *BuildError) Unwrap() error { return e.Err }
