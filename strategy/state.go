package strategy

import (
	"context"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// State is the narrow extension point through which code outside a strategy
// saves and restores the strategy's variables: it describes them as the
// tensors of a checkpoint and lets the caller extend the strategy's graph
// with ops over them and run those ops. Package checkpoint is built on it;
// programs use checkpoint.NewSaver and checkpoint.NewManager rather than
// State itself. Every strategy's State method returns one.
type State interface {
	// Saveables lists the tensors a checkpoint of the strategy holds,
	// sorted by name: every variable, optimizer slots included, and any
	// counter the strategy keeps.
	Saveables() []Saveable
	// HostDevice returns the CPU device of ops that belong to no variable
	// (the checkpoint's prefix, its metadata, the merge of its shards).
	HostDevice() string
	// Extend builds ops in the strategy's graph while no step runs: build
	// gets a scope with a namespace of its own, derived from name. Ops
	// built this way run only through Run.
	Extend(name string, build func(sc *op.Scope) error) error
	// Run runs ops built by Extend. When it succeeds, after (if not nil)
	// runs before any step can: to record that restored variables hold
	// values.
	Run(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation, after func()) ([]*tf.Tensor, error)
}

// Saveable is one tensor of a checkpoint as a strategy holds it: whole, or
// in slices stored on different devices (the shards of a partitioned
// variable).
type Saveable struct {
	// Name is the checkpoint key.
	Name string
	// DType and Shape describe the whole tensor.
	DType tf.DataType
	Shape []int64
	// AnyRows lets a checkpoint hold the tensor with another first
	// dimension (one row per worker, saved by a job of another size):
	// Write then gets it as saved and makes the slice's value from it.
	AnyRows bool
	// Variable is the model variable saved, or nil for a strategy's own
	// state (such as a counter).
	Variable Variable
	// Slices hold the tensor: one for a tensor held whole.
	Slices []SaveSlice
	// Copies, when set, saves besides the tensor the copy that each
	// replica holds of it: an OnRead variable's, whose value is their
	// aggregate. A restore from a checkpoint saved with as many replicas
	// gives each replica its own copy back, in place of Slices.
	Copies *ReplicaCopies
}

// ReplicaCopies are the copies of a Saveable that the replicas hold, saved
// as one tensor of Replicas rows of the Saveable's shape: row g is global
// replica g's copy.
type ReplicaCopies struct {
	// Replicas is the number of replicas in sync, the tensor's rows.
	Replicas int
	// SaveSlice reads and writes the whole tensor (its Spec is "").
	SaveSlice
}

// SaveSlice is one part of a Saveable.
type SaveSlice struct {
	// Device is the CPU device that saves and restores the slice.
	Device string
	// Spec is TensorFlow's shape-and-slice spec of the slice ("9 4 0,5:-"
	// for rows 0-4 of a [9 4] tensor), "" for the whole tensor.
	Spec string
	// Read builds the value a checkpoint holds for the slice.
	Read func(sc *op.Scope) (tf.Output, error)
	// Write builds the ops that give the slice value, read from a
	// checkpoint.
	Write func(sc *op.Scope, value tf.Output) ([]*tf.Operation, error)
	// Restored records, once Write's ops ran, that the slice holds a
	// value, so that its initialiser never runs.
	Restored func()
}
