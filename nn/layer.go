package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// Layer is one built part of a model: its variables and its computation
// for one replica. The same Layer runs under every strategy.
type Layer interface {
	// Vars returns the layer's trainable variables.
	Vars() []strategy.Variable
	// Apply builds the layer for one replica on x, whose first dimension
	// is the batch; training selects training behaviour (dropout on,
	// batch statistics) over inference.
	Apply(r strategy.Replica, x tf.Output, training bool) (tf.Output, error)
}

// Spec describes a layer before its variables exist, as Keras' layer
// configurations do: Dense{Units: 10}, Conv2D{Filters: 6, Kernel: 3}, ….
type Spec interface {
	// Build creates the layer's variables in sc, named "<name>/…", for
	// inputs whose shape without the batch dimension is in, and returns
	// the layer and the shape of its outputs (again without the batch).
	// seed seeds the layer's random initial values and masks.
	Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error)
	// Kind names the layer's type ("dense", "conv2d", …); layers of a
	// model are named <model>/<kind>_<i>.
	Kind() string
}

// Sequential is a model of layers applied one after the other: a Model
// of one input and one output, computing as its Policy says (float32
// unless WithPolicy gives another).
type Sequential struct {
	*Model
}

// NewSequential builds a model named name for inputs of shape in (without
// the batch dimension) from specs, creating every layer's variables in sc:
// layer i is named <name>/<kind>_<k> (k counting layers of its kind) and
// seeded with seed+i. An error names the layer, its input shape and what
// it expected.
func NewSequential(sc strategy.Scope, name string, in []int64, seed int64, specs ...Spec) (*Sequential, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("nn: model %q: no layers", name)
	}
	x := Input(in...)
	y := x
	for _, spec := range specs {
		y = callSpec(spec, []*Tensor{y})
	}
	m, err := NewModel(sc, name, []*Tensor{x}, []*Tensor{y}, WithSeed(seed))
	if err != nil {
		return nil, err
	}
	return &Sequential{m}, nil
}

// WithPolicy returns the model computing under the mixed-precision policy
// p (see Model.WithPolicy). m is unchanged.
func (m *Sequential) WithPolicy(p Policy) *Sequential { return &Sequential{m.Model.WithPolicy(p)} }

// checkInput reports how x's static shape (batch first) does not fit want
// (without the batch); unknown dimensions fit anything.
func checkInput(x tf.Output, want []int64) error {
	got, err := x.Shape().ToSlice()
	if err != nil {
		return nil // unknown rank: TensorFlow checks at run time
	}
	fits := len(got) == len(want)+1
	for i := 0; fits && i < len(want); i++ {
		fits = got[i+1] < 0 || want[i] < 0 || got[i+1] == want[i]
	}
	if !fits {
		return fmt.Errorf("input shape %v, expected %v (-1: any batch)", got, append([]int64{-1}, want...))
	}
	return nil
}

func prod(d []int64) int64 {
	p := int64(1)
	for _, v := range d {
		p *= v
	}
	return p
}

// readAll returns r's reads of vs, in order.
func readAll(r strategy.Replica, vs ...strategy.Variable) ([]tf.Output, error) {
	out := make([]tf.Output, len(vs))
	for i, v := range vs {
		var err error
		if out[i], err = r.Read(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}
