// Package partition runs a TensorFlow graph whose ops are placed on several
// tasks of a cluster without TensorFlow's distributed runtime: it splits
// the graph into one fragment per task, each a graph a task's own local
// session runs, and orders the runs of those fragments into rounds. A
// value that one task computes and another needs (a variable read on a ps
// task, a gradient computed on a worker) is fetched from the first task's
// run and fed to a later run of the second, so that tensors cross
// processes by whatever carries the runs' feeds and fetches: tfdist's own
// connections, not TensorFlow's gRPC.
//
// A Plan is made once per signature (feeds, fetches, targets) of a graph
// and executed once per step. The runs of one round are independent and
// run concurrently, one per task; rounds run in order.
package partition

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	nodepb "github.com/wamuir/graft/tensorflow/core/framework/node_def_go_proto"
	"google.golang.org/protobuf/proto"
)

// Spec is what a plan runs: the values the caller feeds, the values it
// fetches and the ops it runs for their effects, all of one graph.
type Spec struct {
	Feeds   []tf.Output
	Fetches []tf.Output
	Targets []*tf.Operation
	// Default is the task of an op that names no task and neither reads a
	// resource nor is colocated with an op that does: the task that runs
	// the step ("/job:worker/replica:0/task:0").
	Default string
}

// Plan is a graph split across tasks: one fragment per task and the runs
// that execute them, round by round.
type Plan struct {
	// Fragments holds each task's part of the graph, a serialized GraphDef
	// whose ops keep their names and carry only the device within the task
	// ("/device:CPU:0", or none).
	Fragments map[string][]byte
	// Rounds lists, in order, the runs of each round: at most one per task.
	Rounds [][]Run
	// Feeds and Fetches name the caller's values (tensor names of the
	// source graph), in Spec's order.
	Feeds, Fetches []string
}

// Run is one run of one task's fragment.
type Run struct {
	Task string
	// Feeds gives each tensor of the fragment the run feeds, and the value
	// it is fed: a value an earlier run fetched, or one the caller fed.
	Feeds []Feed
	// Fetches names tensors of the fragment whose values later runs or the
	// caller need; each is stored under its own name.
	Fetches []string
	// Targets names ops of the fragment the run executes for their
	// effects.
	Targets []string
}

// Feed feeds tensor Tensor of a fragment with the value named Value.
type Feed struct {
	Tensor string
	Value  string
}

// node is an op of the source graph the plan needs.
type node struct {
	def   *nodepb.NodeDef
	op    *tf.Operation
	task  string
	local string // the device within the task, or ""
	// floating: placed on Spec.Default for want of a device of its own
	floating bool
	round    int
	ins      []edge
	outs     []edge
}

// edge is an input of an op: output index of op from (data), or a control
// input (index -1).
type edge struct {
	from, to *node
	index    int
	fed      bool // the caller feeds the value
	back     bool // a loop's NextIteration into its Merge
}

func (e edge) control() bool { return e.index < 0 }

func (e edge) value() string { return e.from.def.Name + ":" + strconv.Itoa(e.index) }

// New plans the part of g that spec needs. Every op must be placed on a
// task, or on no task when Spec.Default takes it; a value that cannot
// cross tasks (a resource handle, a variant) used on a task other than
// its own is an error naming both ops.
func New(g *tf.Graph, spec Spec) (*Plan, error) {
	if spec.Default == "" {
		return nil, fmt.Errorf("partition: Spec.Default: no task given for ops without one")
	}
	if len(spec.Fetches) == 0 && len(spec.Targets) == 0 {
		return nil, fmt.Errorf("partition: nothing to run (no fetches, no targets)")
	}
	def, err := graphDef(g)
	if err != nil {
		return nil, err
	}
	p := &planner{g: g, spec: spec, byName: map[string]*nodepb.NodeDef{}, nodes: map[string]*node{}, fed: map[string]bool{}}
	for _, n := range def.Node {
		p.byName[n.Name] = n
	}
	for _, f := range spec.Feeds {
		p.fed[name(f)] = true
	}
	if err := p.prune(); err != nil {
		return nil, err
	}
	if err := p.place(); err != nil {
		return nil, err
	}
	order, err := p.order()
	if err != nil {
		return nil, err
	}
	p.schedule(order)
	if p.refine(order) {
		p.schedule(order)
	}
	if err := p.checkCuts(); err != nil {
		return nil, err
	}
	return p.plan(def, order)
}

func name(o tf.Output) string { return o.Op.Name() + ":" + strconv.Itoa(o.Index) }

func graphDef(g *tf.Graph) (*graphpb.GraphDef, error) {
	var buf bytes.Buffer
	if _, err := g.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("partition: serialize the graph: %w", err)
	}
	def := &graphpb.GraphDef{}
	if err := proto.Unmarshal(buf.Bytes(), def); err != nil {
		return nil, fmt.Errorf("partition: parse the graph: %w", err)
	}
	return def, nil
}

// parseInput splits a NodeDef input ("^op", "op:1", "op") into its op and
// output index (-1 for a control input).
func parseInput(in string) (string, int) {
	if c, ok := strings.CutPrefix(in, "^"); ok {
		return c, -1
	}
	if i := strings.LastIndexByte(in, ':'); i >= 0 {
		if k, err := strconv.Atoi(in[i+1:]); err == nil {
			return in[:i], k
		}
	}
	return in, 0
}
