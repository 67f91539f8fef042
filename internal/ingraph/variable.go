package ingraph

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// variable is a variable of the in-graph engine: one copy per local
// replica (one in total under the default strategy), on the replicas'
// devices as TensorFlow resource variables. Under virtual shards an
// OnWrite variable has one copy per device, which its shards share
// (Engine.holder), and an OnRead variable one per shard.
type variable struct {
	name      string
	dtype     tf.DataType
	shape     []int64
	sync      strategy.Synchronization
	agg       strategy.Aggregation
	trainable bool
	owner     *Engine
	handles   []tf.Output // per local replica, the copy it uses
	init      *tf.Operation
	inited    bool
	shard     *shard // a sharded slot's part of the whole, which shape is (Sharding); nil: whole
}

var _ strategy.Variable = (*variable)(nil)

// Name returns the variable's unique name, which is also its key in
// checkpoints.
func (v *variable) Name() string { return v.name }

// DType returns the variable's element type.
func (v *variable) DType() tf.DataType { return v.dtype }

// Shape returns the variable's shape.
func (v *variable) Shape() []int64 { return append([]int64(nil), v.shape...) }

// localShape returns the shape of v's copies: v's, or its shard's.
func (v *variable) localShape() []int64 {
	if v.shard != nil {
		return []int64{v.shard.n}
	}
	return v.shape
}

// Synchronization returns when the copies are kept in sync.
func (v *variable) Synchronization() strategy.Synchronization { return v.sync }

// Aggregation returns how replicas' writes are combined.
func (v *variable) Aggregation() strategy.Aggregation { return v.agg }

// Trainable reports whether optimizers train the variable.
func (v *variable) Trainable() bool { return v.trainable }

// String returns the name, type and shape.
func (v *variable) String() string { return fmt.Sprintf("%s:%v%v", v.name, v.dtype, v.shape) }

// scope is the in-graph engine's Scope.
type scope struct {
	g      *Engine
	closed bool
}

// Variable creates a variable named name (unique within the strategy; it is
// also the variable's checkpoint key) of the given type and shape, with one
// copy per replica device, all initialised from one value built by init.
func (sc *scope) Variable(name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (strategy.Variable, error) {
	if sc == nil || sc.closed {
		return nil, strategy.ErrScopeClosed
	}
	v, err := sc.g.newVariable(name, dtype, shape, init, opts...)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// NumReplicasInSync returns the number of replicas of the scope's strategy.
func (sc *scope) NumReplicasInSync() int { return sc.g.NumReplicasInSync() }
