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
	tag    string // the task, as op names may hold it
	nodes  []*nodepb.NodeDef
	byName map[string]*nodepb.NodeDef
	names  map[string]bool
	recvs  map[string]received // by the value received
	alive  map[string]string   // tensor -> its liveness (see liveness)
	fedBy  map[string]string   // placeholder's tensor -> the value it receives
}

func newFragment(task string) *fragment {
	return &fragment{tag: strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(task, "/")),
		byName: map[string]*nodepb.NodeDef{}, names: map[string]bool{}, recvs: map[string]received{}, alive: map[string]string{},
		fedBy: map[string]string{}}
}

// received is how a fragment receives a value: the tensor that holds it,
// and the feeds of each run that uses it.
type received struct {
	tensor string
	feeds  []Feed
}

// append adds def to f.
func (f *fragment) append(def *nodepb.NodeDef) {
	f.nodes = append(f.nodes, def)
	f.byName[def.Name] = def
}

// plan writes the fragments and the runs.
func (p *planner) plan(src *graphpb.GraphDef, order []*node) (*Plan, error) {
	frags := map[string]*fragment{}
	frag := func(task string) *fragment {
		f := frags[task]
		if f == nil {
			f = newFragment(task)
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
				sw, err := f.reswitch(e.from, n.round, func(in edge) (string, error) { return p.pass(f, frag, in, r, fetch) })
				if err != nil {
					return nil, err
				}
				def.Input = append(def.Input, fmt.Sprintf("%s:%d", sw, e.index))
			case cut(e):
				in, err := p.pass(f, frag, e, r, fetch)
				if err != nil {
					return nil, err
				}
				def.Input = append(def.Input, in)
			default:
				if e.from.task != n.task {
					f.copyOf(e.from)
				}
				def.Input = append(def.Input, e.from.def.Name+":"+fmt.Sprint(e.index))
			}
		}
		f.append(def)
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
// first use: its inputs are the values of sw's, which pass gives it.
func (f *fragment) reswitch(sw *node, round int, pass func(edge) (string, error)) (string, error) {
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
			recv, err := pass(in)
			if err != nil {
				return "", err
			}
			def.Input = append(def.Input, recv)
		}
	}
	f.append(def)
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
	f.append(def)
}

func (r *Run) addFeed(tensor, value string) {
	for _, f := range r.Feeds {
		if f.Tensor == tensor {
			return
		}
	}
	r.Feeds = append(r.Feeds, Feed{Tensor: tensor, Value: value})
}

// pass passes e's value to f, e.to's fragment, in r, e.to's run, and
// returns the tensor of f that holds it: a placeholder fed the value that
// the producer's run fetches (or the caller feeds), or, for a value that
// may be dead there, its sendable form made dead again when it was (see
// liveness).
func (p *planner) pass(f *fragment, frag func(task string) *fragment, e edge, r *Run, fetch func(*node, string)) (string, error) {
	var from *fragment
	alive := ""
	if !e.fed {
		from = frag(e.from.task)
		alive = from.liveness(e.value())
	}
	v := e.value()
	rc, ok := f.recvs[v]
	if !ok {
		var err error
		if rc, err = p.receive(f, from, e, alive, fetch); err != nil {
			return "", err
		}
		f.recvs[v] = rc
	}
	for _, fd := range rc.feeds {
		r.addFeed(fd.Tensor, fd.Value)
	}
	return rc.tensor, nil
}

// receive adds to f the ops that receive e's value, whose liveness in
// from is alive, and has the producer's run fetch what they are fed.
func (p *planner) receive(f, from *fragment, e edge, alive string, fetch func(*node, string)) (received, error) {
	v := e.value()
	out := e.from.op.Output(e.index)
	dims := shapeDims(out.Shape())
	if alive == "" {
		recv, err := f.recv(e, v, dims)
		if !e.fed {
			fetch(e.from, v)
		}
		f.fedBy[recv] = v
		return received{tensor: recv, feeds: []Feed{{Tensor: recv, Value: v}}}, err
	}
	if !fullyKnown(dims) {
		dims = nil // a dead value's zero is a scalar
	}
	sendable := from.sendable(v, alive, out.DataType(), dims)
	fetch(e.from, sendable)
	aliveValue, ok := from.fedBy[alive] // a run cannot fetch what it is fed: pass on the value it was
	if !ok {
		aliveValue = alive
		owner := e.from // the run of an op of the source graph is its own
		if n, ok := p.nodes[strings.SplitN(alive, ":", 2)[0]]; ok && n.task == e.from.task {
			owner = n
		}
		fetch(owner, alive)
	}
	recv, err := f.recv(e, sendable, dims)
	if err != nil {
		return received{}, err
	}
	recvAlive, err := f.placeholder("recv/"+strings.ReplaceAll(alive, ":", "_"), tf.Bool, []int64{}, nil)
	if err != nil {
		return received{}, err
	}
	typ := map[string]*attrpb.AttrValue{"T": {Value: &attrpb.AttrValue_Type{Type: typespb.DataType(out.DataType())}}}
	live := strings.TrimSuffix(f.add("Live", "Switch", typ, recv, recvAlive), ":0") + ":1"
	f.fedBy[recv], f.fedBy[recvAlive] = sendable, aliveValue
	return received{tensor: live, feeds: []Feed{{Tensor: recv, Value: sendable}, {Tensor: recvAlive, Value: aliveValue}}}, nil
}

// recv returns a new placeholder of f that receives value, of e's dtype
// and of shape dims (nil: any), which lists the variables e's value
// updates.
func (f *fragment) recv(e edge, value string, dims []int64) (string, error) {
	return f.placeholder("recv/"+strings.ReplaceAll(value, ":", "_"), e.from.op.Output(e.index).DataType(), dims, updatedBy(e))
}

// placeholder adds a placeholder named after base, of dtype dt and shape
// dims (nil: any), listing the variables updates, and returns its tensor.
func (f *fragment) placeholder(base string, dt tf.DataType, dims []int64, updates []string) (string, error) {
	if _, ok := typespb.DataType_name[int32(dt)]; !ok {
		return "", fmt.Errorf("partition: placeholder %s: unknown dtype %d", base, dt)
	}
	name := f.unique(base)
	attr := map[string]*attrpb.AttrValue{"dtype": {Value: &attrpb.AttrValue_Type{Type: typespb.DataType(dt)}}}
	if dims != nil {
		attr["shape"] = &attrpb.AttrValue{Value: &attrpb.AttrValue_Shape{Shape: shapeProto(dims)}}
	}
	if len(updates) > 0 {
		attr[updatesAttr] = updatesList(updates)
	}
	f.append(&nodepb.NodeDef{Name: name, Op: "Placeholder", Attr: attr})
	return name + ":0", nil
}

func fullyKnown(dims []int64) bool {
	if dims == nil {
		return false
	}
	for _, d := range dims {
		if d < 0 {
			return false
		}
	}
	return true
}

func shapeProto(dims []int64) *shapepb.TensorShapeProto {
	sh := &shapepb.TensorShapeProto{}
	for _, d := range dims {
		sh.Dim = append(sh.Dim, &shapepb.TensorShapeProto_Dim{Size: d})
	}
	return sh
}
