package engineops

// #cgo LDFLAGS: -ltensorflow -ltensorflow_framework
// #include <stdint.h>
// #include <stdlib.h>
// #include "kernels.h"
// void tfdist_register_ops(TF_Status* st);
import "C"

import (
	"runtime/cgo"
	"sync"
	"unsafe"

	"github.com/google/uuid"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// The collective ops' types. Each runs on a CPU device as an async kernel
// that hands its input to a collective.Group of this process and completes
// when the group does, so no TensorFlow thread waits on the network.
const (
	opAllReduce       = "TfdistAllReduce"
	opAllGather       = "TfdistAllGather"
	opReduceScatter   = "TfdistReduceScatter"
	opAllGatherBlocks = "TfdistAllGatherBlocks"
	opBroadcast       = "TfdistBroadcast"
	opAggregate       = "TfdistAggregate"
)

var (
	registerOnce sync.Once
	registerErr  error
	groups       sync.Map // group id → *collective.Group
	aggregators  sync.Map // aggregator id → Aggregator
)

// registerOps registers the collective ops and their kernels with
// TensorFlow, once per process.
func registerOps() error {
	registerOnce.Do(func() {
		st := C.TF_NewStatus()
		defer C.TF_DeleteStatus(st)
		if registerErr = serveQueue(); registerErr != nil {
			return
		}
		C.tfdist_register_ops(st)
		registerErr = statusError(st, "register tfdist collective ops")
	})
	return registerErr
}

// collectiveDTypes are the element types the collective ops take: their T
// attribute in ops.c.
var collectiveDTypes = map[tf.DataType]collective.DType{
	tf.Float: collective.Float32, tf.Double: collective.Float64, tf.Half: collective.Float16,
	tf.Bfloat16: collective.BFloat16, tf.Int32: collective.Int32, tf.Int64: collective.Int64,
}

// CollectiveDType returns the engine's element type for dt, and whether
// the collective ops take dt at all.
func CollectiveDType(dt tf.DataType) (collective.DType, bool) {
	d, ok := collectiveDTypes[dt]
	return d, ok
}

// RegisterGroup makes g reachable from the collective ops of this process
// under the returned id, until unregister is called.
func RegisterGroup(g *collective.Group) (id string, unregister func()) {
	id = uuid.NewString()
	groups.Store(id, g)
	return id, func() { groups.Delete(id) }
}

// Aggregator combines the members' votes, gathered in rank order, into out
// (of a vote's length), the same on every member; an error fails the step.
type Aggregator func(votes [][]float32, out []float32) error

// RegisterAggregator makes agg reachable from the Aggregate ops of this
// process under the returned id, until unregister is called.
func RegisterAggregator(agg Aggregator) (id string, unregister func()) {
	id = uuid.NewString()
	aggregators.Store(id, agg)
	return id, func() { aggregators.Delete(id) }
}

func addCollective(s *op.Scope, typ string, in tf.Output, attrs map[string]any) tf.Output {
	if err := registerOps(); err != nil {
		s.UpdateErr(typ, err)
		return tf.Output{}
	}
	o := s.AddOperation(tf.OpSpec{Type: typ, Input: []tf.Input{in}, Attrs: attrs})
	if o == nil {
		return tf.Output{}
	}
	return o.Output(0)
}

// AllReduce adds an op that reduces in across the group registered as
// group, matched on every member by name. red is collective.Sum, Min or
// Max. wire, when not 0, is the type a float32 in travels as
// (collective.Compress: Float16, BFloat16, or for a sum Int8).
func AllReduce(s *op.Scope, in tf.Output, group, name string, red collective.Reduction, wire collective.DType) tf.Output {
	return addCollective(s, opAllReduce, in, map[string]any{"group": group, "tensor_name": name, "reduction": red.String(), "wire": wireAttr(wire)})
}

// wireAttr is the wire attribute of wire: "none" for 0.
func wireAttr(wire collective.DType) string {
	if wire == 0 {
		return "none"
	}
	return wire.String()
}

// AllReduceInTreeOrder adds an op that sums in across the group as
// AllReduce does, along the binary tree over the members' ranks of
// collective.InTreeOrder: the same bits for members that each bring the
// tree sum of an aligned block of a larger tree's leaves, whatever their
// number.
func AllReduceInTreeOrder(s *op.Scope, in tf.Output, group, name string) tf.Output {
	return addCollective(s, opAllReduce, in, map[string]any{"group": group, "tensor_name": name, "reduction": treeSum, "wire": "none"})
}

// treeSum is the reduction attribute of AllReduceInTreeOrder.
const treeSum = "sum_in_tree_order"

// ReduceScatter adds an op that reduces in (of any shape, the same on every
// member) across the group as AllReduce does and outputs this member's
// block of the flattened result, a vector of collective.ScatterBlock's
// length, with the bits AllReduce gives those elements: an AllGather of
// the members' outputs is the flattened all-reduce. wire, when not 0, is
// collective.Int8, for a float32 sum sent as AllReduce sends it with that
// wire, whose bits the block then has.
func ReduceScatter(s *op.Scope, in tf.Output, group, name string, red collective.Reduction, wire collective.DType) tf.Output {
	return addCollective(s, opReduceScatter, in, map[string]any{"group": group, "tensor_name": name, "reduction": red.String(), "wire": wireAttr(wire)})
}

// AllGatherBlocks adds an op that puts every member's block, in (this
// member's, as ReduceScatter outputs it), into its place in a vector of
// total elements, the whole buffer (collective.Group.AllGatherBlocks).
func AllGatherBlocks(s *op.Scope, in tf.Output, group, name string, total int64) tf.Output {
	out := addCollective(s, opAllGatherBlocks, in, map[string]any{"group": group, "tensor_name": name, "total": total})
	return op.Reshape(s.SubScope("whole"), out, op.Const(s.SubScope("shape"), []int64{total}))
}

// AllGather adds an op that concatenates every member's in along axis 0, in
// rank order.
func AllGather(s *op.Scope, in tf.Output, group, name string) tf.Output {
	return addCollective(s, opAllGather, in, map[string]any{"group": group, "tensor_name": name})
}

// Broadcast adds an op whose output, on every member, is in as the member
// of rank root has it.
func Broadcast(s *op.Scope, in tf.Output, group, name string, root int) tf.Output {
	return addCollective(s, opBroadcast, in, map[string]any{"group": group, "tensor_name": name, "root": int64(root)})
}

// Aggregate adds an op that gathers every member's in (float32, any shape)
// and combines the votes with the Aggregator registered as aggregator; the
// output has in's shape.
func Aggregate(s *op.Scope, in tf.Output, group, name, aggregator string) tf.Output {
	return addCollective(s, opAggregate, in, map[string]any{"group": group, "tensor_name": name, "aggregator": aggregator})
}

// AggregateRows adds an op that combines the rows of in (float32, a vote
// per row along axis 0, each of any shape) with the Aggregator registered
// as aggregator, in this process alone; every row of the output, of in's
// shape, holds the result.
func AggregateRows(s *op.Scope, in tf.Output, aggregator string) tf.Output {
	return addCollective(s, opAggregate, in, map[string]any{"group": "", "tensor_name": "replicas", "aggregator": aggregator})
}

// The kinds of collective kernel, as ops.c's create functions
// pass them.
const (
	kindAllReduce C.int = iota
	kindAllGather
	kindBroadcast
	kindAggregate
	kindLargest
	kindReduceScatter
	kindAllGatherBlocks
)

// kernel is one collective op node's kernel: its attributes.
type kernel struct {
	kind  C.int
	group string
	name  string
	red   collective.Reduction
	root  int
	agg   string // the Aggregator's id
	wire  collective.DType
	tree  bool  // an all-reduce in tree order
	k     int64 // LargestIndices'
	total int   // AllGatherBlocks' elements
}

var (
	reductions = map[string]collective.Reduction{"sum": collective.Sum, "min": collective.Min, "max": collective.Max, treeSum: collective.Sum}
	wires      = map[string]collective.DType{"none": 0, "float16": collective.Float16, "bfloat16": collective.BFloat16, "int8": collective.Int8}
)

//export tfdistKernelCreate
func tfdistKernelCreate(ctx *C.TF_OpKernelConstruction, kind C.int) C.uintptr_t {
	st := C.TF_NewStatus()
	defer C.TF_DeleteStatus(st)
	k := &kernel{kind: kind}
	var err error
	if kind == kindLargest {
		var n C.int64_t
		C.TF_OpKernelConstruction_GetAttrInt64(ctx, cstr("k"), &n, st)
		err = statusError(st, "attr k")
		k.k = int64(n)
	} else if k.group, err = stringAttr(ctx, "group", st); err == nil {
		k.name, err = stringAttr(ctx, "tensor_name", st)
	}
	if err == nil && (kind == kindAllReduce || kind == kindReduceScatter) {
		var r string
		r, err = stringAttr(ctx, "reduction", st)
		k.red, k.tree = reductions[r], r == treeSum
		if err == nil {
			r, err = stringAttr(ctx, "wire", st)
			k.wire = wires[r]
		}
	}
	if err == nil && kind == kindAggregate {
		k.agg, err = stringAttr(ctx, "aggregator", st)
	}
	if err == nil && kind == kindAllGatherBlocks {
		var total C.int64_t
		C.TF_OpKernelConstruction_GetAttrInt64(ctx, cstr("total"), &total, st)
		err = statusError(st, "attr total")
		k.total = int(total)
	}
	if err == nil && kind == kindBroadcast {
		var root C.int64_t
		C.TF_OpKernelConstruction_GetAttrInt64(ctx, cstr("root"), &root, st)
		err = statusError(st, "attr root")
		k.root = int(root)
	}
	if err != nil {
		setStatus(st, tfrt.InvalidArgument, err.Error())
		C.TF_OpKernelConstruction_Failure(ctx, st)
	}
	return C.uintptr_t(cgo.NewHandle(k))
}

//export tfdistKernelDelete
func tfdistKernelDelete(h C.uintptr_t) { cgo.Handle(h).Delete() }

// attrNames holds C copies of the attribute names, which live as long as
// the process.
var attrNames sync.Map

func cstr(s string) *C.char {
	if p, ok := attrNames.Load(s); ok {
		return p.(*C.char)
	}
	p, _ := attrNames.LoadOrStore(s, C.CString(s))
	return p.(*C.char)
}

func stringAttr(ctx *C.TF_OpKernelConstruction, name string, st *C.TF_Status) (string, error) {
	var list, total C.int32_t
	C.TF_OpKernelConstruction_GetAttrSize(ctx, cstr(name), &list, &total, st)
	if err := statusError(st, "attr "+name); err != nil {
		return "", err
	}
	if total <= 0 {
		return "", nil
	}
	buf := C.malloc(C.size_t(total))
	defer C.free(buf)
	C.TF_OpKernelConstruction_GetAttrString(ctx, cstr(name), (*C.char)(buf), C.size_t(total), st)
	if err := statusError(st, "attr "+name); err != nil {
		return "", err
	}
	return C.GoStringN((*C.char)(buf), C.int(total)), nil
}

func setStatus(st *C.TF_Status, code tfrt.Code, msg string) {
	m := C.CString(msg)
	defer C.free(unsafe.Pointer(m))
	C.TF_SetStatus(st, C.TF_Code(code), m)
}

// statusError returns nil for an OK status, else the status as a
// *tfrt.Error of op.
func statusError(s *C.TF_Status, op string) error {
	code := tfrt.Code(C.TF_GetCode(s))
	if code == tfrt.OK {
		return nil
	}
	return &tfrt.Error{Code: code, Op: op, Msg: C.GoString(C.TF_Message(s))}
}
