package partition

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	attrpb "github.com/wamuir/graft/tensorflow/core/framework/attr_value_go_proto"
	nodepb "github.com/wamuir/graft/tensorflow/core/framework/node_def_go_proto"
	tensorpb "github.com/wamuir/graft/tensorflow/core/framework/tensor_go_proto"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"
)

// Values that may be dead. A branch of a Switch that is not taken is
// dead, and so is every op it feeds, up to a Merge: TensorFlow skips them.
// A run cannot fetch a dead value, so one that may be dead crosses from
// run to run as two values: its liveness, a bool the producer computes
// from the predicates of the Switches upstream of it, and the value
// itself, or a zero in its place when it is dead (a Merge of the value and
// of a zero that is live only then). The consumer makes it dead again
// behind a Switch on the liveness. A step guarded against being applied
// twice (the parameter-server strategy's) is dead past its guard on a
// rerun, and an optimizer that combines shards on several tasks (a global
// norm) passes such values between them.

// liveness returns the tensor of f, a bool scalar, that holds whether
// tensor (of f) is live, adding the ops that compute it on first use; ""
// when tensor is live whenever its run runs: no Switch of f is upstream of
// it short of a Merge. A Merge is taken as live: the end of a conditional
// whose Switch's input was live.
func (f *fragment) liveness(tensor string) string {
	if a, ok := f.alive[tensor]; ok {
		return a
	}
	f.alive[tensor] = "" // a loop's back edge (NextIteration into Merge) ends here
	opName, k := parseInput(strings.TrimPrefix(tensor, "^"))
	def := f.byName[opName]
	var terms []string
	switch {
	case def == nil || def.Op == "Merge" || def.Op == "RefMerge":
	default:
		for _, in := range def.Input {
			if a := f.liveness(in); a != "" {
				terms = append(terms, a)
			}
		}
		if (def.Op == "Switch" || def.Op == "RefSwitch") && !strings.HasPrefix(tensor, "^") {
			terms = append(terms, f.branch(def.Input[1], k))
		}
	}
	a := f.and(terms)
	f.alive[tensor] = a
	return a
}

// branch returns the tensor that holds whether output k of a Switch on
// pred is taken: pred for the true branch (1), its negation for the false.
func (f *fragment) branch(pred string, k int) string {
	if k == 1 {
		return pred
	}
	return f.add("Not", "LogicalNot", nil, pred)
}

// and returns the conjunction of terms ("" for none).
func (f *fragment) and(terms []string) string {
	seen := map[string]bool{}
	var out string
	for _, t := range terms {
		switch {
		case seen[t]:
		case out == "":
			out = t
		default:
			out = f.add("And", "LogicalAnd", nil, out, t)
		}
		seen[t] = true
	}
	return out
}

// add adds an op of type typ to f, named after kind and unique in the
// plan, and returns its output 0.
func (f *fragment) add(kind, typ string, attr map[string]*attrpb.AttrValue, inputs ...string) string {
	name := f.unique(fmt.Sprintf("tfdist_%s/%s", f.tag, kind))
	f.nodes = append(f.nodes, &nodepb.NodeDef{Name: name, Op: typ, Input: inputs, Attr: attr})
	f.byName[name] = f.nodes[len(f.nodes)-1]
	return name + ":0"
}

// unique returns base, or base_N, whichever no op of f has.
func (f *fragment) unique(base string) string {
	name := base
	for i := 1; f.names[name]; i++ {
		name = fmt.Sprintf("%s_%d", base, i)
	}
	f.names[name] = true
	return name
}

// sendable returns what f's run fetches for tensor, of dtype dt, whose
// liveness is alive: the tensor when it is live, and zeros of shape dims
// (nil: a scalar) when it is dead.
func (f *fragment) sendable(tensor, alive string, dt tf.DataType, dims []int64) string {
	t := typespb.DataType(dt)
	typ := map[string]*attrpb.AttrValue{"T": {Value: &attrpb.AttrValue_Type{Type: t}}}
	zero := f.add("Zero", "Const", map[string]*attrpb.AttrValue{
		"dtype": {Value: &attrpb.AttrValue_Type{Type: t}},
		"value": {Value: &attrpb.AttrValue_Tensor{Tensor: &tensorpb.TensorProto{Dtype: t, TensorShape: shapeProto(dims)}}},
	})
	ifDead := f.add("IfDead", "Switch", typ, zero, alive) // output 0: live when alive is false
	merge := map[string]*attrpb.AttrValue{"T": typ["T"], "N": {Value: &attrpb.AttrValue_I{I: 2}}}
	return f.add("Sendable", "Merge", merge, tensor, ifDead)
}
