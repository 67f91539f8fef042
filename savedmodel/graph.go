package savedmodel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	corepb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"github.com/wamuir/graft/tensorflow/op"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// graph is the inference graph of an export: the signatures, one resource
// variable per model variable they read, and the ops that save and
// restore those variables.
type graph struct {
	g       *tf.Graph
	root    *op.Scope
	sigs    []builtSignature
	vars    []strategy.Variable // sorted by name
	handles map[string]handle   // by variable name
	saver   *saverOps           // nil without variables
	def     *graphpb.GraphDef   // the graph, without the ops that feed the values
}

type handle struct {
	v      strategy.Variable
	out    tf.Output
	readBy string // the first signature that read it
}

type builtSignature struct {
	name            string
	inputs, outputs map[string]tf.Output
}

type saverOps struct {
	filename, saveTensor tf.Output
	def                  *corepb.SaverDef
}

// buildGraph builds sigs, the variables they read and the saver, and
// checks that each signature's outputs depend only on its own inputs.
func buildGraph(sigs []Signature) (*graph, error) {
	g := &graph{g: tf.NewGraph(), handles: map[string]handle{}}
	g.root = op.NewScopeWithGraph(g.g)
	for _, s := range sigs {
		if err := g.addSignature(s); err != nil {
			return nil, fmt.Errorf("savedmodel: signature %q: %w", s.Name, err)
		}
	}
	sort.Slice(g.vars, func(i, j int) bool { return g.vars[i].Name() < g.vars[j].Name() })
	if err := g.addSaver(); err != nil {
		return nil, fmt.Errorf("savedmodel: saver: %w", err)
	}
	var buf bytes.Buffer
	if _, err := g.g.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("savedmodel: serialise the graph: %w", err)
	}
	g.def = &graphpb.GraphDef{}
	if err := proto.Unmarshal(buf.Bytes(), g.def); err != nil {
		return nil, fmt.Errorf("savedmodel: read back the graph: %w", err)
	}
	if err := g.checkInputs(); err != nil {
		return nil, err
	}
	return g, nil
}

// addSignature makes s's placeholders and runs its Fn on them.
func (g *graph) addSignature(s Signature) error {
	bs := builtSignature{name: s.Name, inputs: map[string]tf.Output{}}
	in := strategy.Inputs{}
	for _, name := range sortedKeys(s.Inputs) {
		spec := s.Inputs[name]
		ph, err := g.g.AddOperation(tf.OpSpec{Type: "Placeholder", Name: s.Name + "_" + name,
			Attrs: map[string]any{"dtype": spec.DType, "shape": tf.MakeShape(spec.Shape...)}})
		if err != nil {
			return fmt.Errorf("input %q: %w", name, err)
		}
		bs.inputs[name], in[name] = ph.Output(0), ph.Output(0)
	}
	r := &replica{g: g, sig: s.Name, scope: g.root.SubScope(s.Name), reads: map[strategy.Variable]tf.Output{}}
	var outs strategy.Outputs
	err := graphutil.Safely(func() error {
		var err error
		if outs, err = s.Fn(r, in); err != nil {
			return err
		}
		return r.scope.Err()
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return err
	}
	if len(outs) == 0 {
		return errors.New("its Fn returned no outputs; expected at least one")
	}
	for name, o := range outs {
		if !validKey.MatchString(name) {
			return fmt.Errorf("output name %q: expected letters, digits and _ (not starting with a digit)", name)
		}
		if o.Op == nil {
			return fmt.Errorf("output %q is not a tensor", name)
		}
	}
	bs.outputs = outs
	g.sigs = append(g.sigs, bs)
	return nil
}

// handle returns the resource variable of v, created on first use by the
// signature sig.
func (g *graph) handle(v strategy.Variable, sig string) (tf.Output, error) {
	if v == nil {
		return tf.Output{}, fmt.Errorf("read of a nil variable")
	}
	if h, ok := g.handles[v.Name()]; ok {
		if h.v != v {
			return tf.Output{}, fmt.Errorf("two different variables are named %q", v.Name())
		}
		return h.out, nil
	}
	o, err := g.g.AddOperation(tf.OpSpec{Type: "VarHandleOp", Name: v.Name(), Attrs: map[string]any{
		"dtype": v.DType(), "shape": tf.MakeShape(v.Shape()...), "shared_name": v.Name()}})
	if err != nil {
		return tf.Output{}, fmt.Errorf("variable %q: %w", v.Name(), err)
	}
	g.handles[v.Name()] = handle{v: v, out: o.Output(0), readBy: sig}
	g.vars = append(g.vars, v)
	return o.Output(0), nil
}

// addSaver builds TensorFlow 1's saver ops over the variables, as the
// SaverDef of a SavedModel names them: a filename tensor, a save that
// returns it, and one op that restores every variable.
func (g *graph) addSaver() error {
	if len(g.vars) == 0 {
		return nil
	}
	s := g.root.SubScope("save")
	n := len(g.vars)
	names, specs := make([]string, n), make([]string, n)
	dtypes, reads := make([]tf.DataType, n), make([]tf.Output, n)
	return graphutil.Safely(func() error {
		for i, v := range g.vars {
			names[i], dtypes[i] = v.Name(), v.DType()
			reads[i] = op.ReadVariableOp(s.SubScope("read"), g.handles[v.Name()].out, v.DType())
		}
		filename := op.PlaceholderWithDefault(s.SubScope("Const"), op.Const(s.SubScope("filename"), "model"), tf.ScalarShape())
		tn := op.Const(s.SubScope("tensor_names"), names)
		ss := op.Const(s.SubScope("shape_and_slices"), specs)
		save := op.SaveV2(s, filename, tn, ss, reads)
		saveTensor := op.Identity(s.SubScope("control_dependency").WithControlDependencies(save), filename)
		restored := op.RestoreV2(s.SubScope("restore"), filename, tn, ss, dtypes)
		assigns := make([]*tf.Operation, n)
		for i, v := range g.vars {
			assigns[i] = op.AssignVariableOp(s.SubScope("assign"), g.handles[v.Name()].out, restored[i])
		}
		restoreAll := op.NoOp(s.SubScope("restore_all").WithControlDependencies(assigns...))
		if err := s.Err(); err != nil {
			return err
		}
		g.saver = &saverOps{filename: filename, saveTensor: saveTensor, def: &corepb.SaverDef{
			FilenameTensorName: tensorName(filename), SaveTensorName: tensorName(saveTensor),
			RestoreOpName: restoreAll.Name(), MaxToKeep: 5, KeepCheckpointEveryNHours: 10000,
			Version: corepb.SaverDef_V2,
		}}
		return nil
	})
}

// readValues reads the value of every variable the signatures read from
// src, checked against the variable's type and shape.
func (g *graph) readValues(ctx context.Context, src strategy.ValueReader) ([]*tf.Tensor, error) {
	values := make([]*tf.Tensor, len(g.vars))
	for i, v := range g.vars {
		t, err := src.Value(ctx, v)
		if err != nil {
			return nil, fmt.Errorf("savedmodel: variable %q, read by signature %q: %w", v.Name(), g.handles[v.Name()].readBy, err)
		}
		if t.DataType() != v.DType() || !slices.Equal(t.Shape(), v.Shape()) {
			return nil, fmt.Errorf("savedmodel: variable %q: the strategy read a %s%v value, expected %s%v", v.Name(),
				graphutil.DTypeName(t.DataType()), t.Shape(), graphutil.DTypeName(v.DType()), v.Shape())
		}
		values[i] = t
	}
	return values, nil
}

// write writes the SavedModel into dir: the variables, given values, with
// the graph's own save op, then saved_model.pb.
func (g *graph) write(dir string, values []*tf.Tensor) error {
	vars := filepath.Join(dir, "variables")
	if err := os.Mkdir(vars, 0o755); err != nil {
		return err
	}
	if g.saver != nil {
		if err := g.writeVariables(filepath.Join(vars, "variables"), values); err != nil {
			return fmt.Errorf("write the variables: %w", err)
		}
	}
	pb, err := g.savedModel()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "saved_model.pb"), pb, 0o644)
}

// writeVariables assigns values to the graph's variables in a session of
// its own and runs the saver's save op into prefix. The ops that feed the
// values are not part of the exported graph.
func (g *graph) writeVariables(prefix string, values []*tf.Tensor) error {
	feeds := map[tf.Output]*tf.Tensor{}
	assigns := make([]*tf.Operation, len(g.vars))
	s := g.root.SubScope("export_feed")
	err := graphutil.Safely(func() error {
		for i, v := range g.vars {
			ph := op.Placeholder(s.SubScope("value"), v.DType(), op.PlaceholderShape(tf.MakeShape(v.Shape()...)))
			assigns[i] = op.AssignVariableOp(s.SubScope("assign"), g.handles[v.Name()].out, ph)
			feeds[ph] = values[i]
		}
		return s.Err()
	})
	if err != nil {
		return err
	}
	sess, err := tf.NewSession(g.g, nil)
	if err != nil {
		return err
	}
	defer sess.Close()
	if _, err := sess.Run(feeds, nil, assigns); err != nil {
		return err
	}
	p, err := tf.NewTensor(prefix)
	if err != nil {
		return err
	}
	_, err = sess.Run(map[tf.Output]*tf.Tensor{g.saver.filename: p}, []tf.Output{g.saver.saveTensor}, nil)
	return err
}

func (g *graph) signatureNames() []string {
	names := make([]string, len(g.sigs))
	for i, s := range g.sigs {
		names[i] = s.name
	}
	return names
}

func tensorName(o tf.Output) string { return fmt.Sprintf("%s:%d", o.Op.Name(), o.Index) }

func sortedKeys[M ~map[string]V, V any](m M) []string { return slices.Sorted(maps.Keys(m)) }

// nodeName returns the node an input of a NodeDef names ("^x", "x:1",
// "x").
func nodeName(input string) string {
	input = strings.TrimPrefix(input, "^")
	if i := strings.LastIndexByte(input, ':'); i >= 0 {
		return input[:i]
	}
	return input
}
