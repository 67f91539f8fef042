package strategy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// Initializer builds a variable's initial value on scope s, which is pinned to
// the device that computes it. It must be deterministic when replicas of the
// program (workers) are to agree without a broadcast: use seeded, stateless
// random ops.
type Initializer func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error)

// Build builds the initial value on s and checks its type: the value of a
// variable of dtype and shape, as every strategy creates one.
func (init Initializer) Build(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
	if init == nil {
		return tf.Output{}, errors.New("nil initializer")
	}
	val, err := init(s, dtype, shape)
	if err != nil {
		return tf.Output{}, err
	}
	if err := s.Err(); err != nil {
		return tf.Output{}, err
	}
	if val.DataType() != dtype {
		return tf.Output{}, fmt.Errorf("the initializer gives %s, expected %s", graphutil.DTypeName(val.DataType()), graphutil.DTypeName(dtype))
	}
	return val, nil
}

// Zeros initialises a variable to zero.
func Zeros() Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		return op.Fill(s, op.Const(s.SubScope("shape"), shape), zeroOf(s.SubScope("zero"), dtype)), nil
	}
}

// Constant initialises a variable to the given tensor, which must have the
// variable's type and shape.
func Constant(value *tf.Tensor) Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		if value.DataType() != dtype {
			return tf.Output{}, fmt.Errorf("initial value: dtype %s, expected %s", graphutil.DTypeName(value.DataType()), graphutil.DTypeName(dtype))
		}
		if !slices.Equal(value.Shape(), shape) {
			return tf.Output{}, fmt.Errorf("initial value: shape %v, expected %v", value.Shape(), shape)
		}
		return op.Const(s, value), nil
	}
}

func zeroOf(s *op.Scope, dtype tf.DataType) tf.Output {
	switch dtype {
	case tf.Float:
		return op.Const(s, float32(0))
	case tf.Double:
		return op.Const(s, float64(0))
	case tf.Int32:
		return op.Const(s, int32(0))
	case tf.Int64:
		return op.Const(s, int64(0))
	}
	return op.Cast(s, op.Const(s, int32(0)), dtype)
}

// VariableOption sets a property of a variable.
type VariableOption func(*VariableConfig)

// VariableConfig is what VariableOptions set; strategies read it with
// NewVariableConfig.
type VariableConfig struct {
	Synchronization Synchronization
	Aggregation     Aggregation
	Trainable       bool
	// Partitioner, when set, shards the variable (parameter-server
	// strategy only).
	Partitioner Partitioner
}

// WithSynchronization sets when copies are kept in sync (default OnWrite).
func WithSynchronization(s Synchronization) VariableOption {
	return func(c *VariableConfig) { c.Synchronization = s }
}

// WithAggregation sets how replicas' writes are combined (default None).
func WithAggregation(a Aggregation) VariableOption {
	return func(c *VariableConfig) { c.Aggregation = a }
}

// Trainable sets whether the variable is trained (default true for OnWrite,
// false for OnRead).
func Trainable(on bool) VariableOption {
	return func(c *VariableConfig) { c.Trainable = on }
}

// WithPartitioner shards the variable along its first axis as p says. The
// parameter-server strategy honours it (its WithPartitioner option sets a
// default for every variable); the synchronous strategies keep every
// variable whole.
func WithPartitioner(p Partitioner) VariableOption {
	return func(c *VariableConfig) { c.Partitioner = p }
}

// NewVariableConfig applies opts to the defaults and checks the result for
// the variable named name: its name, its shape (every dimension known) and
// an OnRead variable that is not trainable.
func NewVariableConfig(name string, shape []int64, opts ...VariableOption) (VariableConfig, error) {
	c := VariableConfig{Trainable: true}
	if !validName.MatchString(name) {
		return c, fmt.Errorf("strategy: variable name %q: expected letters, digits and _.-/ (not starting with a punctuation mark)", name)
	}
	for i, d := range shape {
		if d < 0 {
			return c, fmt.Errorf("strategy: variable %q: shape %v: dimension %d is %d, expected a known size", name, shape, i, d)
		}
	}
	explicit := false
	for _, o := range opts {
		before := c.Trainable
		o(&c)
		explicit = explicit || c.Trainable != before
	}
	if c.Synchronization == OnRead && !explicit {
		c.Trainable = false
	}
	if c.Synchronization == OnRead && c.Trainable {
		return c, fmt.Errorf("strategy: variable %q: an OnRead variable cannot be trainable", name)
	}
	return c, nil
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-/]*$`)
