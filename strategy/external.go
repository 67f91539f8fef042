package strategy

import (
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"
)

// This file lets an engine that builds its own graphs — the
// parameter-server strategy, whose variables live on ps tasks and whose
// steps run in one graph per worker — hand its variables to an Optimizer.
// Such an engine creates its variables itself and wraps each in an external
// Variable (NewExternalVariable); a SlotStore then gives it ApplyContexts
// whose slot and non-slot variables live in the engine's graph.

// dtResource is TensorFlow's DT_RESOURCE (TF_RESOURCE), which graft does
// not name.
const dtResource tf.DataType = 20

// NewExternalVariable returns a Variable that stands for a resource variable
// created outside any InGraph engine: handle is its resource handle (the
// output of a VarHandleOp) in the graph the caller builds in. The Variable
// has one copy, that handle; it belongs to no engine, so InGraph methods
// reject it, but an Optimizer given an ApplyContext of a SlotStore updates
// it, and ApplyContext.Handle returns handle. The caller initialises the
// variable. Of opts, only Trainable applies: synchronization and
// aggregation are the creating engine's business.
func NewExternalVariable(name string, dtype tf.DataType, shape []int64, handle tf.Output, opts ...VariableOption) (Copies, error) {
	cfg, err := NewVariableConfig(name, shape, opts...)
	if err != nil {
		return nil, err
	}
	if handle.Op == nil {
		return nil, fmt.Errorf("strategy: external variable %q: no handle", name)
	}
	if handle.DataType() != dtResource {
		return nil, fmt.Errorf("strategy: external variable %q: handle is %s, expected a resource handle", name, DTypeName(handle.DataType()))
	}
	return &variable{name: name, dtype: dtype, shape: append([]int64(nil), shape...), sync: OnWrite, agg: AggregationNone,
		trainable: cfg.Trainable, handles: []tf.Output{handle}, inited: true}, nil
}

// SlotStore keeps the slot variables (momentum accumulators, Adam's
// moments) and non-slot variables (step counts) that optimizers ask an
// ApplyContext for, in a graph that no InGraph engine owns.
//
// The store creates every such variable without a device. TensorFlow's
// placer then colocates each slot with the variable it serves, through the
// apply op that takes both (a resource edge), as TensorFlow's own slot
// creator does with colocate_with. A non-slot variable is colocated with
// whatever consumes it; the engine pins it by giving one of its readers a
// device. Placement of that kind needs the whole graph placed at once (the
// default; not GraphOptions.place_pruned_graph).
//
// Each variable is named as under an InGraph engine — "<variable>/<optimizer>/<slot>"
// for a slot, "<optimizer>/<name>" for a non-slot variable — and its
// VarHandleOp's shared_name is "<name>/replica_0", so two stores in two
// graphs that create the same variable address the same resource on the
// device it is placed on. Initial values are computed, when the engine runs
// a variable's Init op, wherever the session places device-less ops.
//
// A SlotStore is not safe for concurrent use; the engine serialises graph
// building.
type SlotStore struct {
	e *InGraph
}

// NewSlotStore returns an empty store that builds in g. Its ops are named
// under "var/<name>", so the engine must keep its own ops out of that
// namespace.
func NewSlotStore(g *tf.Graph) *SlotStore {
	if g == nil {
		return nil
	}
	return &SlotStore{e: &InGraph{
		cfg: Config{Name: "slot-store", Devices: []string{""}, NumReplicasInSync: 1, NumWorkers: 1},
		log: zap.NewNop(), graph: g,
		byName: map[string]*variable{}, scopes: map[string]int{}, slots: map[slotKey]*variable{},
		reducers: map[string]*hostReducer{},
	}}
}

// ApplyContext returns an ApplyContext for an Optimizer's Apply: scope is
// where the update ops go, Handle(v) is v's only copy (v must have one, as
// external variables do), and Slot and NonSlot create their variables in the
// store.
func (st *SlotStore) ApplyContext(scope *op.Scope) (ApplyContext, error) {
	if st == nil || st.e == nil {
		return nil, errors.New("strategy: nil SlotStore")
	}
	if scope == nil {
		return nil, errors.New("strategy: SlotStore.ApplyContext: nil scope")
	}
	return &applyContext{e: st.e, scope: scope, replica: 0}, nil
}

// SlotInfo describes one variable of a SlotStore.
type SlotInfo struct {
	// Var is the slot or non-slot variable. Its Handle(0) has no device.
	Var Copies
	// Primary is the variable a slot serves; nil for a non-slot variable.
	Primary Variable
	// Owner is the optimizer's name ("Adam"), Slot the slot's ("m") or the
	// non-slot variable's ("iterations").
	Owner, Slot string
	// Init assigns the variable its initial value.
	Init *tf.Operation
}

// Slots returns the store's variables in creation order.
func (st *SlotStore) Slots() []SlotInfo {
	if st == nil || st.e == nil {
		return nil
	}
	keys := make(map[*variable]slotKey, len(st.e.slots))
	for k, v := range st.e.slots {
		keys[v] = k
	}
	out := make([]SlotInfo, 0, len(st.e.vars))
	for _, v := range st.e.vars {
		k := keys[v]
		info := SlotInfo{Var: v, Owner: k.owner, Slot: k.slot, Init: v.init}
		if k.v != nil {
			info.Primary = k.v
		}
		out = append(out, info)
	}
	return out
}
