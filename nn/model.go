package nn

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Model is a built model: the layers between its inputs and outputs, with
// their variables, computing as its Policy says. One Model trains
// unchanged under every strategy. A Model with one output is itself a
// MultiSpec: called as a layer in another model's definition, it shares
// its variables with every other call.
type Model struct {
	name    string
	inputs  []*Tensor
	outputs []*Tensor
	names   map[*Tensor]string // the inputs' names
	layers  []*builtLayer      // in build order
	calls   []*Tensor          // every layer call's output, in a topological order
	shapes  map[*Tensor][]int64
	built   map[*Tensor]*builtLayer // each call's layer
	policy  Policy
}

// builtLayer is one layer of a model, with what Summary shows of it.
type builtLayer struct {
	name  string
	kind  string
	in    [][]int64 // the input shapes it was built for
	out   []int64
	layer MultiLayer
	vars  []strategy.Variable // every variable, trainable or not
}

// ModelOption configures NewModel.
type ModelOption func(*modelConfig)

type modelConfig struct{ seed int64 }

// WithSeed seeds the model's random initial values and dropout masks:
// layer i (in the order the layers were first called) is seeded with
// seed+i. The default is 0.
func WithSeed(seed int64) ModelOption { return func(c *modelConfig) { c.seed = seed } }

// NewModel builds a model named name from its inputs to its outputs
// (keras.Model(inputs, outputs)): every layer called between them, in
// the order they were called, with its variables created in sc. A layer
// called more than once (Share) is built once. An error names the layer,
// its input shapes and what it expected; a model whose outputs do not
// depend on its inputs, or depend on inputs it was not given, is an
// error.
func NewModel(sc strategy.Scope, name string, inputs, outputs []*Tensor, opts ...ModelOption) (*Model, error) {
	var cfg modelConfig
	for _, o := range opts {
		o(&cfg)
	}
	m := &Model{name: name, inputs: slices.Clone(inputs), outputs: slices.Clone(outputs), policy: Float32,
		names: map[*Tensor]string{}, shapes: map[*Tensor][]int64{}, built: map[*Tensor]*builtLayer{}}
	if err := m.link(); err != nil {
		return nil, fmt.Errorf("nn: model %q: %w", name, err)
	}
	if err := m.build(sc, cfg.seed); err != nil {
		return nil, fmt.Errorf("nn: model %q: %w", name, err)
	}
	return m, nil
}

// link checks the definition and orders the layer calls between the
// inputs and the outputs.
func (m *Model) link() error {
	if len(m.inputs) == 0 || len(m.outputs) == 0 {
		return fmt.Errorf("%d inputs and %d outputs, expected at least one of each", len(m.inputs), len(m.outputs))
	}
	given := map[*Tensor]int{}
	for i, in := range m.inputs {
		if in == nil || in.call != nil {
			return fmt.Errorf("input %d is not an nn.Input", i)
		}
		if _, dup := given[in]; dup {
			return fmt.Errorf("input %d is given twice", i)
		}
		given[in] = i
	}
	seen := map[*Tensor]bool{}
	for i, out := range m.outputs {
		if out == nil {
			return fmt.Errorf("output %d is nil", i)
		}
		reached, err := m.visit(out, given, seen)
		if err != nil {
			return fmt.Errorf("output %d: %w", i, err)
		}
		if !reached {
			return fmt.Errorf("output %d does not depend on the model's inputs", i)
		}
	}
	slices.SortFunc(m.calls, func(a, b *Tensor) int { return int(a.id - b.id) })
	return nil
}

// visit collects the calls t depends on and reports whether it depends
// on one of the given inputs; seen holds that of every call visited.
func (m *Model) visit(t *Tensor, given map[*Tensor]int, seen map[*Tensor]bool) (bool, error) {
	if t.call == nil {
		if _, ok := given[t]; !ok {
			return false, fmt.Errorf("depends on an input of shape %v that is not among the model's inputs", append([]int64{-1}, t.shape...))
		}
		return true, nil
	}
	if reached, ok := seen[t]; ok {
		return reached, nil
	}
	m.calls = append(m.calls, t)
	reached := false
	for i, x := range t.call.inputs {
		if x == nil {
			return false, fmt.Errorf("a %s layer's input %d is nil", t.call.layer.spec.Kind(), i)
		}
		r, err := m.visit(x, given, seen)
		if err != nil {
			return false, err
		}
		reached = reached || r
	}
	seen[t] = reached
	return reached, nil
}

// build builds every layer in call order and infers every tensor's shape.
func (m *Model) build(sc strategy.Scope, seed int64) error {
	for i, in := range m.inputs {
		m.names[in] = in.name
		if in.name == "" {
			m.names[in] = fmt.Sprintf("input_%d", i)
		}
		m.shapes[in] = in.shape
	}
	layers := map[*Shared]*builtLayer{}
	byName := map[string]*builtLayer{}
	kinds := map[string]int{}
	for _, t := range m.calls {
		in := make([][]int64, len(t.call.inputs))
		for j, x := range t.call.inputs {
			in[j] = m.shapes[x]
		}
		bl, ok := layers[t.call.layer]
		if nested, isModel := t.call.layer.spec.(*Model); isModel && !ok {
			// Every call of one nested model shares its variables.
			bl, ok = byName[nested.name]
		}
		if ok {
			if err := fitShapes(in, bl.in); err != nil {
				return fmt.Errorf("layer %s, called again: %w", bl.name, err)
			}
		} else {
			name := m.layerName(t.call.layer, kinds)
			if byName[name] != nil {
				return fmt.Errorf("layer %s: two layers of the model have that name", name)
			}
			var err error
			if bl, err = buildLayer(sc, t.call.layer.spec, name, in, seed+int64(len(m.layers))); err != nil {
				return fmt.Errorf("layer %s: %w", name, err)
			}
			layers[t.call.layer], byName[name] = bl, bl
			m.layers = append(m.layers, bl)
		}
		m.shapes[t], m.built[t] = bl.out, bl
	}
	return nil
}

// layerName returns the name of the layer l in the model: its own, the
// name of a nested model, or "<model>/<kind>_<k>".
func (m *Model) layerName(l *Shared, kinds map[string]int) string {
	if l.name != "" {
		return m.name + "/" + l.name
	}
	if nested, ok := l.spec.(*Model); ok {
		return nested.name
	}
	kind := l.spec.Kind()
	k := kinds[kind]
	kinds[kind]++
	return fmt.Sprintf("%s/%s_%d", m.name, kind, k)
}

// buildLayer builds spec for inputs of the shapes in, recording every
// variable it creates.
func buildLayer(sc strategy.Scope, spec AnySpec, name string, in [][]int64, seed int64) (*builtLayer, error) {
	ms, err := multi(spec)
	if err != nil {
		return nil, err
	}
	rec := &recorder{Scope: sc}
	l, out, err := ms.BuildMulti(rec, name, in, seed)
	if err != nil {
		return nil, err
	}
	vars := rec.vars
	if nested, ok := spec.(*Model); ok {
		vars = nested.Variables()
	}
	return &builtLayer{name: name, kind: spec.Kind(), in: in, out: out, layer: l, vars: vars}, nil
}

// recorder is a Scope that records the variables created through it.
type recorder struct {
	strategy.Scope
	vars []strategy.Variable
}

func (r *recorder) Variable(name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (strategy.Variable, error) {
	v, err := r.Scope.Variable(name, dtype, shape, init, opts...)
	if err == nil {
		r.vars = append(r.vars, v)
	}
	return v, err
}

// fitShapes reports how the shapes got do not fit want; -1 fits any
// size.
func fitShapes(got, want [][]int64) error {
	fits := len(got) == len(want)
	for i := 0; fits && i < len(got); i++ {
		fits = fitShape(got[i], want[i])
	}
	if !fits {
		return fmt.Errorf("inputs of shapes %v, expected %v (without the batch; -1: any size)", got, want)
	}
	return nil
}

func fitShape(got, want []int64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] >= 0 && want[i] >= 0 && got[i] != want[i] {
			return false
		}
	}
	return true
}

// Name returns the model's name, the prefix of its variables' names.
func (m *Model) Name() string { return m.name }

// Vars returns the model's trainable variables, in layer order: what
// Minimize takes.
func (m *Model) Vars() []strategy.Variable {
	var out []strategy.Variable
	for _, v := range m.Variables() {
		if v.Trainable() {
			out = append(out, v)
		}
	}
	return out
}

// Variables returns every variable of the model, trainable or not
// (BatchNorm's moving statistics, Dropout's step count), in layer order.
func (m *Model) Variables() []strategy.Variable {
	var out []strategy.Variable
	seen := map[strategy.Variable]bool{}
	for _, l := range m.layers {
		for _, v := range l.vars {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	return out
}

// InputInfo describes one input of a model.
type InputInfo struct {
	// Name is the input's name: the one Named gave it, or the one
	// NewModel gave it ("input_0", "input_1", …).
	Name string
	// DType is the type of its examples.
	DType tf.DataType
	// Shape is the shape of one example, without the batch dimension; -1
	// is a dimension of any size.
	Shape []int64
}

// Inputs describes the model's inputs, in order.
func (m *Model) Inputs() []InputInfo {
	out := make([]InputInfo, len(m.inputs))
	for i, in := range m.inputs {
		out[i] = InputInfo{Name: m.names[in], DType: in.dtype, Shape: slices.Clone(in.shape)}
	}
	return out
}

// OutputCount returns the number of the model's outputs.
func (m *Model) OutputCount() int { return len(m.outputs) }

// OutputShape returns the shape of the model's first output without the
// batch dimension.
func (m *Model) OutputShape() []int64 { return slices.Clone(m.shapes[m.outputs[0]]) }

// WithPolicy returns the model computing under the mixed-precision policy
// p: the same layers and variables (float32 under every policy), with
// each layer's floating-point inputs cast to p's compute type and the
// outputs cast back to float32. m is unchanged.
func (m *Model) WithPolicy(p Policy) *Model {
	c := *m
	c.policy = p
	return &c
}

// Policy returns the model's mixed-precision policy.
func (m *Model) Policy() Policy { return m.policy }

// Apply builds the model, of one input and one output, for one replica on
// x ([batch, in...]); training selects training behaviour (dropout on,
// batch statistics) over inference.
func (m *Model) Apply(r strategy.Replica, x tf.Output, training bool) (tf.Output, error) {
	if len(m.inputs) != 1 || len(m.outputs) != 1 {
		return tf.Output{}, fmt.Errorf("nn: model %s: Apply on a model of %d inputs and %d outputs; use Outputs", m.name, len(m.inputs), len(m.outputs))
	}
	ys, err := m.Outputs(r, []tf.Output{x}, training)
	if err != nil {
		return tf.Output{}, err
	}
	return ys[0], nil
}

// Outputs builds the model for one replica on xs, one per input in the
// model's order, and returns its outputs in order. Under a mixed policy
// it casts each layer's floating-point inputs to the 16-bit compute type
// and returns float32 outputs, so that losses and metrics compute in
// float32.
func (m *Model) Outputs(r strategy.Replica, xs []tf.Output, training bool) ([]tf.Output, error) {
	if err := m.checkInputs(xs); err != nil {
		return nil, fmt.Errorf("nn: model %s: %w", m.name, err)
	}
	var b *Builder
	if m.policy.Mixed() {
		b = NewBuilder(r.Scope(), "autocast")
	}
	vals := make(map[*Tensor]tf.Output, len(m.calls)+len(xs))
	for i, in := range m.inputs {
		vals[in] = xs[i]
	}
	for _, t := range m.calls {
		ins := make([]tf.Output, len(t.call.inputs))
		for j, x := range t.call.inputs {
			if ins[j] = vals[x]; b != nil && graphutil.IsFloat(ins[j].DataType()) {
				ins[j] = b.Cast(ins[j], m.policy.ComputeDType())
			}
		}
		bl := m.built[t]
		var y tf.Output
		err := graphutil.Safely(func() (err error) {
			y, err = bl.layer.ApplyMulti(r, ins, training)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("nn: layer %s: %w", bl.name, err)
		}
		vals[t] = y
	}
	ys := make([]tf.Output, len(m.outputs))
	for i, o := range m.outputs {
		if ys[i] = vals[o]; b != nil && isHalf(ys[i].DataType()) {
			ys[i] = b.Cast(ys[i], tf.Float)
		}
	}
	if b != nil {
		return ys, b.Err()
	}
	return ys, nil
}

// checkInputs reports how xs do not fit the model's inputs.
func (m *Model) checkInputs(xs []tf.Output) error {
	if len(xs) != len(m.inputs) {
		return fmt.Errorf("%d inputs given, expected %d", len(xs), len(m.inputs))
	}
	for i, in := range m.inputs {
		if xs[i].Op == nil {
			return fmt.Errorf("input %s: no tensor", m.names[in])
		}
		if err := checkInput(xs[i], in.shape); err != nil {
			if len(xs) == 1 {
				return err
			}
			return fmt.Errorf("input %s: %w", m.names[in], err)
		}
		if dt := xs[i].DataType(); dt != in.dtype && !(graphutil.IsFloat(dt) && graphutil.IsFloat(in.dtype)) {
			return fmt.Errorf("input %s is %s, expected %s", m.names[in], graphutil.DTypeName(dt), graphutil.DTypeName(in.dtype))
		}
	}
	return nil
}

// Kind implements AnySpec: a model called as a layer.
func (m *Model) Kind() string { return "model" }

// BuildMulti implements MultiSpec: the model, whose variables exist
// already, called as a layer of another model; every call shares them.
// It takes inputs that fit its own and has one output.
func (m *Model) BuildMulti(_ strategy.Scope, _ string, in [][]int64, _ int64) (MultiLayer, []int64, error) {
	if len(m.outputs) != 1 {
		return nil, nil, fmt.Errorf("model %s has %d outputs; a model called as a layer has one", m.name, len(m.outputs))
	}
	want := make([][]int64, len(m.inputs))
	for i, x := range m.inputs {
		want[i] = x.shape
	}
	if err := fitShapes(in, want); err != nil {
		return nil, nil, err
	}
	return m, m.OutputShape(), nil
}

// ApplyMulti implements MultiLayer: the model's one output.
func (m *Model) ApplyMulti(r strategy.Replica, xs []tf.Output, training bool) (tf.Output, error) {
	ys, err := m.Outputs(r, xs, training)
	if err != nil {
		return tf.Output{}, err
	}
	return ys[0], nil
}

// Call returns the output of the model called as a layer on xs, sharing
// its variables.
func (m *Model) Call(xs ...*Tensor) *Tensor { return callSpec(m, xs) }
