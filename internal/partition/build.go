package partition

import (
	"fmt"
	"sort"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	attrpb "github.com/wamuir/graft/tensorflow/core/framework/attr_value_go_proto"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	nodepb "github.com/wamuir/graft/tensorflow/core/framework/node_def_go_proto"
	shapepb "github.com/wamuir/graft/tensorflow/core/framework/tensor_shape_go_proto"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"
	"google.golang.org/protobuf/proto"
)

type runKey struct {
	task  string
	round int
}

// fragment is one task's graph as the plan builds it.
type fragment struct {
	nodes []*nodepb.NodeDef
	names map[string]bool
	recvs map[string]string // value -> the placeholder that receives it
}

// plan writes the fragments and the runs.
func (p *planner) plan(src *graphpb.GraphDef, order []*node) (*Plan, error) {
	frags := map[string]*fragment{}
	frag := func(task string) *fragment {
		f := frags[task]
		if f == nil {
			f = &fragment{names: map[string]bool{}, recvs: map[string]string{}}
			frags[task] = f
		}
		return f
	}
	for _, n := range p.nodes {
		frag(n.task).names[n.def.Name] = true
	}
	runs := map[runKey]*Run{}
	run := func(task string, round int) *Run {
		k := runKey{task, round}
		if runs[k] == nil {
			runs[k] = &Run{Task: task}
		}
		return runs[k]
	}
	fetched := map[string]bool{}
	fetch := func(n *node, value string) {
		if !fetched[value] {
			fetched[value] = true
			r := run(n.task, n.round)
			r.Fetches = append(r.Fetches, value)
		}
	}
	for _, n := range order {
		f := frag(n.task)
		def := proto.Clone(n.def).(*nodepb.NodeDef)
		def.Device = n.local
		delete(def.Attr, "_class")
		def.Input = def.Input[:0]
		r := run(n.task, n.round)
		for _, e := range n.ins {
			switch {
			case e.control() && (e.from.task != n.task || e.from.round < n.round):
				// ordered by the rounds
			case e.control():
				def.Input = append(def.Input, "^"+e.from.def.Name)
			case reswitched(e):
				sw, err := f.reswitch(e.from, n.round, r, p.g, fetch)
				if err != nil {
					return nil, err
				}
				def.Input = append(def.Input, fmt.Sprintf("%s:%d", sw, e.index))
			case cut(e):
				recv, err := f.recv(e, p.g)
				if err != nil {
					return nil, err
				}
				def.Input = append(def.Input, recv)
				r.addFeed(recv, e.value())
				if !e.fed {
					fetch(e.from, e.value())
				}
			default:
				if e.from.task != n.task {
					f.copyOf(e.from)
				}
				def.Input = append(def.Input, e.from.def.Name+":"+fmt.Sprint(e.index))
			}
		}
		f.nodes = append(f.nodes, def)
		if !recomputable(n) && !consumedIn(n, n.round) {
			r.Targets = append(r.Targets, n.def.Name)
		}
	}
	plan := &Plan{Fragments: map[string][]byte{}}
	for _, o := range p.spec.Fetches {
		n := p.nodes[o.Op.Name()]
		fetch(n, name(o))
		plan.Fetches = append(plan.Fetches, name(o))
	}
	for _, o := range p.spec.Feeds {
		plan.Feeds = append(plan.Feeds, name(o))
	}
	for task, f := range frags {
		b, err := proto.Marshal(&graphpb.GraphDef{Node: f.nodes, Versions: src.Versions, Library: src.Library})
		if err != nil {
			return nil, fmt.Errorf("partition: serialize the fragment of %s: %w", task, err)
		}
		plan.Fragments[task] = b
	}
	plan.Rounds = rounds(runs)
	return plan, nil
}

// consumedIn reports whether an op of n's run uses n.
func consumedIn(n *node, round int) bool {
	for _, e := range n.outs {
		if e.to.task == n.task && e.to.round == round && !cut(e) {
			return true
		}
	}
	return false
}

// rounds orders runs by round, and within a round by task.
func rounds(runs map[runKey]*Run) [][]Run {
	last := -1
	for k := range runs {
		last = max(last, k.round)
	}
	out := make([][]Run, 0, last+1)
	for r := 0; r <= last; r++ {
		var round []Run
		for k, run := range runs {
			if k.round == r && (len(run.Fetches) > 0 || len(run.Targets) > 0) {
				round = append(round, *run)
			}
		}
		sort.Slice(round, func(i, j int) bool { return round[i].Task < round[j].Task })
		if len(round) > 0 {
			out = append(out, round)
		}
	}
	return out
}

// reswitch returns the copy of Switch sw that runs in round, adding it on
// first use: its inputs are the values of sw's, fed to r.
func (f *fragment) reswitch(sw *node, round int, r *Run, g *tf.Graph, fetch func(*node, string)) (string, error) {
	name := fmt.Sprintf("%s/round_%d", sw.def.Name, round)
	if f.names[name] {
		return name, nil
	}
	f.names[name] = true
	def := proto.Clone(sw.def).(*nodepb.NodeDef)
	def.Name, def.Device, def.Input = name, sw.local, nil
	delete(def.Attr, "_class")
	for _, in := range sw.ins {
		switch {
		case in.control():
		case local(in):
			f.copyOf(in.from)
			def.Input = append(def.Input, in.value())
		case in.from.def.Op == "Switch":
			return "", fmt.Errorf("partition: Switch %q reads Switch %q: a Switch run again in a later round reads live values", sw.def.Name, in.from.def.Name)
		default:
			recv, err := f.recv(in, g)
			if err != nil {
				return "", err
			}
			def.Input = append(def.Input, recv)
			r.addFeed(recv, in.value())
			if !in.fed {
				fetch(in.from, in.value())
			}
		}
	}
	f.nodes = append(f.nodes, def)
	return name, nil
}

// copyOf adds to f a copy of a constant of another fragment, once.
func (f *fragment) copyOf(n *node) {
	if f.names[n.def.Name] {
		return
	}
	f.names[n.def.Name] = true
	def := proto.Clone(n.def).(*nodepb.NodeDef)
	def.Device = n.local
	delete(def.Attr, "_class")
	f.nodes = append(f.nodes, def)
}

func (r *Run) addFeed(tensor, value string) {
	for _, f := range r.Feeds {
		if f.Tensor == tensor {
			return
		}
	}
	r.Feeds = append(r.Feeds, Feed{Tensor: tensor, Value: value})
}

// recv returns the tensor of f that receives e's value: a placeholder of
// its dtype and shape, which lists the variables the value updates, added
// on first use.
func (f *fragment) recv(e edge, g *tf.Graph) (string, error) {
	v := e.value()
	if name, ok := f.recvs[v]; ok {
		return name + ":0", nil
	}
	out := e.from.op.Output(e.index)
	dt, ok := typespb.DataType_name[int32(out.DataType())]
	if !ok {
		return "", fmt.Errorf("partition: value %s: unknown dtype %d", v, out.DataType())
	}
	base := "recv/" + strings.ReplaceAll(v, ":", "_")
	name := base
	for i := 1; f.names[name]; i++ {
		name = fmt.Sprintf("%s_%d", base, i)
	}
	f.names[name] = true
	f.recvs[v] = name
	attr := map[string]*attrpb.AttrValue{
		"dtype": {Value: &attrpb.AttrValue_Type{Type: typespb.DataType(typespb.DataType_value[dt])}},
	}
	if sh := shapeProto(out.Shape()); sh != nil {
		attr["shape"] = &attrpb.AttrValue{Value: &attrpb.AttrValue_Shape{Shape: sh}}
	}
	if vars := updatedBy(e); len(vars) > 0 {
		attr[updatesAttr] = updatesList(vars)
	}
	f.nodes = append(f.nodes, &nodepb.NodeDef{Name: name, Op: "Placeholder", Attr: attr})
	return name + ":0", nil
}

func shapeProto(s tf.Shape) *shapepb.TensorShapeProto {
	dims, err := s.ToSlice()
	if err != nil {
		return nil // unknown rank: the placeholder takes any shape
	}
	sh := &shapepb.TensorShapeProto{}
	for _, d := range dims {
		sh.Dim = append(sh.Dim, &shapepb.TensorShapeProto_Dim{Size: d})
	}
	return sh
}
