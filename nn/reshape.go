package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// Reshape gives each example the shape Shape (without the batch), which
// must hold as many elements as its input: [batch, 64] to [batch, 8, 8, 1],
// say.
type Reshape struct {
	Shape []int64
}

// Kind implements Spec.
func (Reshape) Kind() string { return "reshape" }

// Build implements Spec.
func (rs Reshape) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	if prod(rs.Shape) != prod(in) || len(rs.Shape) == 0 {
		return nil, nil, fmt.Errorf("Reshape: shape %v holds %d elements, the input %v holds %d", rs.Shape, prod(rs.Shape), in, prod(in))
	}
	return &reshape{in: in, out: append([]int64(nil), rs.Shape...)}, rs.Shape, nil
}

type reshape struct{ in, out []int64 }

func (l *reshape) Vars() []strategy.Variable { return nil }

func (l *reshape) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "reshape")
	return b.Reshape(x, append([]int64{-1}, l.out...)...), b.Err()
}
