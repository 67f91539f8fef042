package partition

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	nodepb "github.com/wamuir/graft/tensorflow/core/framework/node_def_go_proto"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// Handles: values that mean something only on their own device.
const (
	dtResource = tf.DataType(typespb.DataType_DT_RESOURCE)
	dtVariant  = tf.DataType(typespb.DataType_DT_VARIANT)
)

type planner struct {
	g      *tf.Graph
	spec   Spec
	byName map[string]*nodepb.NodeDef
	nodes  map[string]*node // the ops the plan needs
	fed    map[string]bool  // values the caller feeds
}

// prune collects the ops the fetches and targets need, stopping at fed
// values, with their edges.
func (p *planner) prune() error {
	var stack []string
	for _, f := range p.spec.Fetches {
		if p.fed[name(f)] {
			return fmt.Errorf("partition: %s is both fed and fetched", name(f))
		}
		stack = append(stack, f.Op.Name())
	}
	for _, t := range p.spec.Targets {
		stack = append(stack, t.Name())
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if p.nodes[n] != nil {
			continue
		}
		def, ok := p.byName[n]
		if !ok {
			return fmt.Errorf("partition: op %q is not in the graph", n)
		}
		p.nodes[n] = &node{def: def, op: p.g.Operation(n)}
		for _, in := range def.Input {
			from, k := parseInput(in)
			if k >= 0 && p.fed[from+":"+fmt.Sprint(k)] {
				continue
			}
			stack = append(stack, from)
		}
	}
	for _, n := range p.nodes {
		for _, in := range n.def.Input {
			from, k := parseInput(in)
			e := edge{to: n, index: k}
			if src := p.nodes[from]; src != nil {
				e.from = src
			} else {
				e.from = &node{def: p.byName[from], op: p.g.Operation(from)} // fed: not run
			}
			e.fed = k >= 0 && p.fed[from+":"+fmt.Sprint(k)]
			e.back = n.def.Op == "Merge" && e.from.def.Op == "NextIteration"
			n.ins = append(n.ins, e)
			if !e.fed {
				e.from.outs = append(e.from.outs, e)
			}
		}
	}
	return nil
}

// place gives every op its task: the one its device names; else that of
// the resource it reads or the op it is colocated with, as TensorFlow's
// placer colocates them; else Spec.Default.
func (p *planner) place() error {
	visiting := map[*node]bool{}
	var place func(n *node) error
	place = func(n *node) error {
		if n.task != "" {
			return nil
		}
		if visiting[n] {
			n.task = p.spec.Default // a colocation cycle: the loop's ops stay together
			return nil
		}
		visiting[n] = true
		d, err := parseDevice(n.def.Device)
		if err != nil {
			return fmt.Errorf("partition: op %q: %w", n.def.Name, err)
		}
		task := taskOf(d)
		d.Job, d.Replica, d.Task = "", -1, -1
		n.local = d.String()
		if task == "" {
			for _, with := range colocatedWith(n) {
				if w := p.nodes[with]; w != nil {
					if err := place(w); err != nil {
						return err
					}
					task = w.task
					break
				}
			}
		}
		for _, e := range n.ins {
			if e.control() || e.fed || e.from.op.Output(e.index).DataType() != dtResource {
				continue
			}
			if err := place(e.from); err != nil {
				return err
			}
			switch {
			case task == "":
				task = e.from.task
			case task != e.from.task:
				return fmt.Errorf("partition: op %q on %s reads resource %q on %s: a resource is used on its own task",
					n.def.Name, task, e.from.def.Name, e.from.task)
			}
		}
		if task == "" {
			if task, err = p.inputsTask(n, place); err != nil {
				return err
			}
		}
		if task == "" {
			task = p.spec.Default
			n.floating = true
		}
		n.task = task
		return nil
	}
	for _, n := range p.nodes {
		if err := place(n); err != nil {
			return err
		}
	}
	return nil
}

// inputsTask returns the task every input of n (a value or a control
// input) comes from, when they come from one task (a floating constant
// aside), or "": an op without a device runs where its inputs are, so that
// the ops of a ps task's update that an optimizer leaves unplaced (which
// read values a Switch gates there, or group the updates) stay with them.
func (p *planner) inputsTask(n *node, place func(*node) error) (string, error) {
	task := ""
	for _, e := range n.ins {
		if e.fed || e.back {
			continue
		}
		if err := place(e.from); err != nil {
			return "", err
		}
		switch {
		case e.from.floating && recomputable(e.from):
		case task == "":
			task = e.from.task
		case task != e.from.task:
			return "", nil
		}
	}
	return task, nil
}

func parseDevice(device string) (tfrt.DeviceSpec, error) {
	if device == "" {
		return tfrt.DeviceSpec{Replica: -1, Task: -1, Index: -1}, nil
	}
	return tfrt.ParseDevice(device)
}

// taskOf returns the task a device names ("/job:ps/replica:0/task:1"), or
// "" when it names no job.
func taskOf(d tfrt.DeviceSpec) string {
	if d.Job == "" {
		return ""
	}
	return fmt.Sprintf("/job:%s/replica:%d/task:%d", d.Job, max(d.Replica, 0), max(d.Task, 0))
}

// colocatedWith returns the ops n's _class attribute colocates it with.
func colocatedWith(n *node) []string {
	a := n.def.Attr["_class"]
	if a == nil || a.GetList() == nil {
		return nil
	}
	var ops []string
	for _, s := range a.GetList().S {
		if op, ok := strings.CutPrefix(string(s), "loc:@"); ok {
			ops = append(ops, op)
		}
	}
	return ops
}

// order returns the needed ops in an order where every op follows its
// inputs (a loop's back edges aside).
func (p *planner) order() ([]*node, error) {
	pending := make(map[*node]int, len(p.nodes))
	var ready []*node
	for _, n := range p.nodes {
		for _, e := range n.ins {
			if !e.fed && !e.back {
				pending[n]++
			}
		}
		if pending[n] == 0 {
			ready = append(ready, n)
		}
	}
	order := make([]*node, 0, len(p.nodes))
	for len(ready) > 0 {
		n := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		order = append(order, n)
		for _, e := range n.outs {
			if e.back {
				continue
			}
			if pending[e.to]--; pending[e.to] == 0 {
				ready = append(ready, e.to)
			}
		}
	}
	if len(order) != len(p.nodes) {
		return nil, fmt.Errorf("partition: the graph has a cycle that is not a loop's (%d of %d ops ordered)", len(order), len(p.nodes))
	}
	return order, nil
}

// recomputable reports whether an op is cheap and pure enough to run again
// in every run that needs it, rather than passing its value on: a
// constant, or a variable's handle, that waits for nothing (a control
// input orders it after other ops).
func recomputable(n *node) bool {
	return (n.def.Op == "Const" || n.def.Op == "VarHandleOp") && len(n.def.Input) == 0
}

// local reports whether e's value is computed where it is used, whatever
// the rounds: a recomputable op on the same task, or a constant that names
// no task, which every fragment that uses it holds a copy of.
func local(e edge) bool {
	if !recomputable(e.from) {
		return false
	}
	return e.from.task == e.to.task || (e.from.def.Op == "Const" && e.from.floating)
}

// lag is how many rounds after e.from's e.to may run at the earliest: 0 on
// the same task, 1 across tasks (the value is fetched, then fed).
func lag(e edge) int {
	if e.from.task == e.to.task {
		return 0
	}
	return 1
}

// schedule gives every op its round: as early as its inputs allow; then an
// op whose consumers all run on its own task runs as late as they allow,
// beside them, so that few values wait on a task from one round to a later
// one (and a Switch runs with what it gates).
func (p *planner) schedule(order []*node) {
	for _, n := range order {
		n.round = 0
		for _, e := range n.ins {
			if e.fed || e.back || local(e) {
				continue
			}
			n.round = max(n.round, e.from.round+lag(e))
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		n := order[i]
		if recomputable(n) || p.isFetched(n) {
			continue
		}
		latest := -1
		for _, e := range n.outs {
			if e.back {
				continue
			}
			if e.to.task != n.task {
				latest = -1
				break
			}
			if latest < 0 || e.to.round < latest {
				latest = e.to.round
			}
		}
		n.round = max(n.round, latest)
	}
}

// refine moves the ops that took Spec.Default for want of a place of their
// own (a NoOp or a constant that waits for updates on the ps tasks, say)
// to where they are needed: beside their consumers when those are all on
// one task, or, without consumers, beside their latest input; so they cost
// no round of their own. It reports whether it moved any.
func (p *planner) refine(order []*node) bool {
	moved := false
	for i := len(order) - 1; i >= 0; i-- {
		n := order[i]
		if !n.floating || recomputable(n) {
			continue
		}
		task, latest := "", -1
		for _, e := range n.outs {
			if e.back {
				continue
			}
			if task != "" && task != e.to.task {
				task = ""
				break
			}
			task = e.to.task
		}
		for _, e := range n.ins {
			if len(n.outs) == 0 && !e.fed && !e.back && e.from.round > latest {
				task, latest = e.from.task, e.from.round
			}
		}
		if task != "" && task != n.task {
			n.task, moved = task, true
		}
	}
	return moved
}

func (p *planner) isFetched(n *node) bool {
	for _, f := range p.spec.Fetches {
		if f.Op.Name() == n.def.Name {
			return true
		}
	}
	return false
}

// cut reports whether e's value passes through the plan's values: it is
// fed, or computed on another task, or in an earlier round by an op that is
// not run again.
func cut(e edge) bool {
	if e.fed {
		return true
	}
	if e.back || local(e) || reswitched(e) {
		return false
	}
	if lag(e) > 0 {
		return true
	}
	return e.from.round < e.to.round && !recomputable(e.from)
}

// reswitched reports whether e reads a Switch of its own task that ran in
// an earlier round: a copy of the Switch runs again in e.to's round, from
// its inputs' values, so that a branch not taken stays dead there rather
// than being passed between runs, which cannot carry a dead value.
func reswitched(e edge) bool {
	return e.from.def.Op == "Switch" && e.from.task == e.to.task && e.from.round < e.to.round
}

// checkCuts rejects values that cannot pass between runs, and loops split
// across runs.
func (p *planner) checkCuts() error {
	for _, n := range p.nodes {
		for _, e := range n.ins {
			if e.back && (e.from.task != n.task || e.from.round != n.round) {
				return fmt.Errorf("partition: loop of %q: its ops run on %s and %s, or in different rounds; a loop runs on one task",
					n.def.Name, n.task, e.from.task)
			}
			if e.control() || !cut(e) || e.fed {
				continue
			}
			switch dt := e.from.op.Output(e.index).DataType(); {
			case dt == dtResource || dt == dtVariant:
				return fmt.Errorf("partition: op %q on %s uses %s, a handle computed on %s: place them on one task",
					n.def.Name, n.task, e.value(), e.from.task)
			case e.from.def.Op == "Switch" || e.from.def.Op == "RefSwitch":
				return fmt.Errorf("partition: op %q on %s uses %s, a branch of a Switch computed on %s: place the Switch with what it gates",
					n.def.Name, n.task, e.value(), e.from.task)
			}
		}
	}
	return nil
}
