package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Embedding maps integer ids in [0, InputDim) to rows of a table
// [InputDim, OutputDim], initialised from U(-0.05, 0.05) as Keras does.
// Inputs of any shape [batch, …] give [batch, …, OutputDim]. The table is
// read through Replica.Lookup: under the parameter-server strategy only
// the rows looked up travel, and Minimize updates them with the sparse
// optimizer of strategy.WithSparseOptimizer; the synchronous strategies
// update it like any variable.
type Embedding struct {
	InputDim, OutputDim int
}

// Kind implements Spec.
func (Embedding) Kind() string { return "embedding" }

// Build implements Spec.
func (e Embedding) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if e.InputDim < 1 || e.OutputDim < 1 {
		return nil, nil, fmt.Errorf("Embedding: InputDim %d, OutputDim %d: expected both at least 1", e.InputDim, e.OutputDim)
	}
	table, err := sc.Variable(name+"/embeddings", tf.Float, []int64{int64(e.InputDim), int64(e.OutputDim)}, uniformInit(seed, 0.05))
	if err != nil {
		return nil, nil, err
	}
	return &embedding{table: table, in: in}, append(append([]int64(nil), in...), int64(e.OutputDim)), nil
}

type embedding struct {
	table strategy.Variable
	in    []int64
}

func (e *embedding) Vars() []strategy.Variable { return []strategy.Variable{e.table} }

func (e *embedding) Apply(r strategy.Replica, ids tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(ids, e.in); err != nil {
		return tf.Output{}, err
	}
	return r.Lookup(e.table, ids)
}

// uniformInit draws from U(-limit, limit), seeded.
func uniformInit(seed int64, limit float64) strategy.Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		return uniform(s, dtype, shape, seed, limit)
	}
}
