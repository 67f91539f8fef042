package partition

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	attrpb "github.com/wamuir/graft/tensorflow/core/framework/attr_value_go_proto"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/internal/graphutil"
)

// updatesAttr lists, on a placeholder that receives a value from another
// task, the variables of its fragment that the value goes on to update:
// what a refused feed names.
const updatesAttr = "_tfdist_updates"

// FeedError reports a value fed to a fragment whose dtype or shape is not
// the one its placeholder takes: a gradient of the wrong shape pushed to a
// ps task, say. The run did not start, so no variable was touched.
type FeedError struct {
	Fragment, Tensor string
	// Got and Want are the dtypes and shapes, as "float32 [3 4]".
	Got, Want string
	// Variables are the variables the value would have updated.
	Variables []string
}

func (e *FeedError) Error() string {
	s := fmt.Sprintf("partition: fragment %q: value %s: fed %s, expected %s", e.Fragment, e.Tensor, e.Got, e.Want)
	if len(e.Variables) > 0 {
		s += fmt.Sprintf(" (it updates variable %v, left untouched)", e.Variables)
	}
	return s + "; nothing ran"
}

// updatedBy returns the variables that ops of e.to's task update from e's
// value, directly or through other ops of the task: the resources of the
// stateful ops that take a resource, reads aside. The walk stops after
// maxWalk ops.
func updatedBy(e edge) []string {
	var vars []string
	seen := map[*node]bool{}
	var queue []*node
	for _, c := range e.from.outs {
		if c.index == e.index && c.to.task == e.to.task && !seen[c.to] {
			seen[c.to] = true
			queue = append(queue, c.to)
		}
	}
	for len(queue) > 0 && len(seen) < maxWalk {
		m := queue[0]
		queue = queue[1:]
		for _, e := range m.ins {
			if v := updated(e); v != "" && !slices.Contains(vars, v) {
				vars = append(vars, v)
			}
		}
		for _, e := range m.outs {
			if !e.control() && e.to.task == m.task && !seen[e.to] {
				seen[e.to] = true
				queue = append(queue, e.to)
			}
		}
	}
	slices.Sort(vars)
	return vars
}

const maxWalk = 10_000

// readsOnly are the ops that take a variable's handle without changing it.
var readsOnly = map[string]bool{"ReadVariableOp": true, "ResourceGather": true, "ResourceGatherNd": true,
	"VarIsInitializedOp": true, "VariableShape": true, "DestroyResourceOp": true}

// updated returns the variable whose handle e gives an op that changes it
// (its shared name, or its op's name), or "".
func updated(e edge) string {
	if e.control() || readsOnly[e.to.def.Op] || e.from.op.Output(e.index).DataType() != dtResource {
		return ""
	}
	if e.from.def.Op == "VarHandleOp" {
		if s := e.from.def.Attr["shared_name"].GetS(); len(s) > 0 {
			return string(s)
		}
	}
	return e.from.def.Name
}

// updatesList is the updatesAttr value of vars.
func updatesList(vars []string) *attrpb.AttrValue {
	l := &attrpb.AttrValue_ListValue{}
	for _, v := range vars {
		l.S = append(l.S, []byte(v))
	}
	return &attrpb.AttrValue{Value: &attrpb.AttrValue_List{List: l}}
}

// fragmentUpdates reads the updatesAttr of each placeholder of fragment.
func fragmentUpdates(fragment []byte) (map[string][]string, error) {
	var g graphpb.GraphDef
	if err := proto.Unmarshal(fragment, &g); err != nil {
		return nil, fmt.Errorf("partition: read a fragment: %w", err)
	}
	out := map[string][]string{}
	for _, n := range g.Node {
		for _, s := range n.Attr[updatesAttr].GetList().GetS() {
			out[n.Name] = append(out[n.Name], string(s))
		}
	}
	return out, nil
}

// feedSpec is what a placeholder of a fragment takes, and the variables
// its value updates.
type feedSpec struct {
	dtype   tf.DataType
	shape   tf.Shape
	updates []string
}

// check returns a *FeedError when t cannot feed the placeholder name of
// the fragment under prefix: another dtype, or a shape its known
// dimensions do not allow.
func (f *feedSpec) check(prefix, name string, t *tf.Tensor) error {
	if t.DataType() == f.dtype && fits(t.Shape(), f.shape) {
		return nil
	}
	return &FeedError{Fragment: prefix, Tensor: name, Got: describe(t.DataType(), t.Shape()),
		Want: describe(f.dtype, shapeDims(f.shape)), Variables: f.updates}
}

// fits reports whether a tensor of shape dims fits s.
func fits(dims []int64, s tf.Shape) bool {
	want, err := s.ToSlice()
	if err != nil {
		return true // any rank
	}
	if len(want) != len(dims) {
		return false
	}
	for i, d := range want {
		if d >= 0 && d != dims[i] {
			return false
		}
	}
	return true
}

// shapeDims returns s's dimensions (-1 unknown), nil for an unknown rank.
func shapeDims(s tf.Shape) []int64 {
	dims, err := s.ToSlice()
	if err != nil {
		return nil
	}
	return dims
}

func describe(dt tf.DataType, dims []int64) string {
	return fmt.Sprintf("%s %v", graphutil.DTypeName(dt), dims)
}
