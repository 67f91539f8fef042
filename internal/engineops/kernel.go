package engineops

// #include <stdint.h>
// #include <stdlib.h>
// #include "queue.h"
// void tfdist_run_done(void* kept);
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/cgo"
	"slices"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/shmbridge"
	"github.com/tfdist/tfdist/internal/tfrt"
)

var kinds = [...]string{kindAllReduce: "all-reduce", kindAllGather: "all-gather", kindBroadcast: "broadcast", kindAggregate: "aggregate",
	kindLargest: "largest indices", kindReduceScatter: "reduce-scatter", kindAllGatherBlocks: "all-gather of blocks"}

// call is one execution of a collective op's kernel. It owns the input and
// output tensors until it runs TensorFlow's done callback, exactly once.
type call struct {
	k       *kernel
	ctx     *C.TF_OpKernelContext
	done    unsafe.Pointer // TensorFlow's done callback, moved to the heap
	in, out *C.TF_Tensor
	dims    []C.int64_t // the input's shape
	g       *collective.Group
	dt      collective.DType
}

// serveQueue starts the goroutine that takes the kernels' calls off the
// queue that their compute functions fill, woken by the queue's eventfd.
func serveQueue() error {
	fd := C.tfdist_queue_open()
	if fd < 0 {
		return &tfrt.Error{Code: tfrt.Internal, Op: "register tfdist collective ops", Msg: "eventfd failed"}
	}
	f := os.NewFile(uintptr(fd), "tfdist-collective-queue")
	go func() {
		var count [8]byte
		for {
			if _, err := f.Read(count[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				continue // an eventfd read fails only when the counter is zero
			}
			var q C.tfdist_call
			for C.tfdist_queue_take(&q) != 0 {
				c := &call{k: cgo.Handle(q.kernel).Value().(*kernel), ctx: q.ctx, done: q.done}
				if err := c.start(); err != nil {
					c.finish(err)
				}
			}
		}
	}()
	return nil
}

// start checks the input, prepares the output and hands the work to a
// goroutine of its own, so that the queue moves on.
func (c *call) start() error {
	st := C.TF_NewStatus()
	defer C.TF_DeleteStatus(st)
	C.TF_GetInput(c.ctx, 0, &c.in, st)
	if err := statusError(st, "input"); err != nil {
		return err
	}
	c.dt, _ = CollectiveDType(tf.DataType(C.TF_TensorType(c.in))) // the op's T attribute allows no other
	c.dims = tensorDims(c.in)
	if c.k.kind == kindLargest {
		return c.startLargest(st)
	}
	if c.k.kind == kindAggregate && c.k.group == "" {
		return c.startAggregateRows(st)
	}
	g, ok := groups.Load(c.k.group)
	if !ok {
		return &tfrt.Error{Code: tfrt.FailedPrecondition, Msg: fmt.Sprintf("no collective group %s in this process (was its strategy closed?)", c.k.group)}
	}
	c.g = g.(*collective.Group)
	if c.k.kind == kindAllGather {
		go c.gather()
		return nil
	}
	if c.k.kind == kindReduceScatter || c.k.kind == kindAllGatherBlocks {
		return c.startBlocks(st)
	}
	if c.k.kind == kindAggregate { // a new output: the votes are read while it is written
		if err := c.allocateLikeInput(st); err != nil {
			return err
		}
		go c.aggregate()
		return nil
	}
	if err := c.reduceOutput(st); err != nil {
		return err
	}
	go c.reduceOrBroadcast()
	return nil
}

// startBlocks allocates a reduce-scatter's output, the member's block of
// the input, or an all-gather of blocks', the whole vector, and runs the
// call on a goroutine of its own.
func (c *call) startBlocks(st *C.TF_Status) error {
	n := c.k.total
	if c.k.kind == kindReduceScatter {
		_, n = collective.ScatterBlock(int(C.TF_TensorByteSize(c.in))/c.dt.Size(), c.g.Size(), c.g.Rank())
	}
	dims := []C.int64_t{C.int64_t(n)}
	c.out = C.TF_AllocateOutput(c.ctx, 0, C.TF_TensorType(c.in), dimsPtr(dims), 1, C.size_t(n*c.dt.Size()), st)
	if err := statusError(st, "allocate output"); err != nil {
		return err
	}
	go func() {
		ctx, out, in := context.Background(), tensorBytes(c.out), tensorBytes(c.in)
		if c.k.kind == kindReduceScatter {
			var opts []collective.CallOption
			if c.k.wire != 0 {
				opts = append(opts, collective.Compress(c.k.wire))
			}
			c.finish(c.g.ReduceScatter(ctx, c.k.name, c.k.red, c.dt, out, in, opts...))
			return
		}
		c.finish(c.g.AllGatherBlocks(ctx, c.k.name, c.dt, out, in))
	}()
	return nil
}

// reduceOutput gives an all-reduce or a broadcast its output: for an
// all-reduce, a buffer its peers write into when the group has one (see
// sharedOutput); else the input, forwarded when TensorFlow allows; else a
// new tensor, which a broadcast fills with its input.
func (c *call) reduceOutput(st *C.TF_Status) error {
	if c.k.kind == kindAllReduce {
		if ok, err := c.sharedOutput(st); ok || err != nil {
			return err
		}
	}
	idx, fwd := C.int(0), C.int(-1)
	c.out = C.TF_ForwardInputOrAllocateOutput(c.ctx, &idx, 1, 0, dimsPtr(c.dims), C.int(len(c.dims)), &fwd, st)
	if err := statusError(st, "allocate output"); err != nil {
		return err
	}
	if fwd < 0 && c.k.kind == kindBroadcast {
		copy(tensorBytes(c.out), tensorBytes(c.in))
	}
	return nil
}

// sharedOutput makes the all-reduce's output a buffer that the group's
// peers on this host map, so that they write their parts of the result
// into it (shmbridge.OutputBuffer); it reports false, having done
// nothing, when the group has none for it.
func (c *call) sharedOutput(st *C.TF_Status) (bool, error) {
	n := int(C.TF_TensorByteSize(c.in))
	b := shmbridge.OutputBuffer(c.g, n)
	if b == nil {
		return false, nil
	}
	data := unsafe.Pointer(unsafe.SliceData(b.Bytes())) // outside Go's heap
	t := C.tfdist_shared_tensor(C.TF_TensorType(c.in), dimsPtr(c.dims), C.int(len(c.dims)), data, C.size_t(n), b.ReleaseFlag())
	if t == nil || C.TF_TensorData(t) != data { // TensorFlow copied it: no use
		if t != nil {
			C.TF_DeleteTensor(t)
		} else {
			b.Release()
		}
		return false, nil
	}
	C.TF_SetOutput(c.ctx, 0, t, st)
	c.out = t // finish deletes this reference; TensorFlow holds its own
	return true, statusError(st, "set output")
}

// aggregator returns the call's Aggregator, checking that the votes are
// float32.
func (c *call) aggregator() (Aggregator, error) {
	agg, ok := aggregators.Load(c.k.agg)
	if !ok {
		return nil, &tfrt.Error{Code: tfrt.FailedPrecondition, Msg: fmt.Sprintf("no aggregator %s in this process (was its strategy closed?)", c.k.agg)}
	}
	if c.dt != collective.Float32 {
		return nil, &tfrt.Error{Code: tfrt.InvalidArgument, Msg: fmt.Sprintf("aggregate of %s: expected float32 votes", c.dt)}
	}
	return agg.(Aggregator), nil
}

// startAggregateRows prepares an aggregate over the rows of the input, the
// votes of one process's replicas, and runs it on a goroutine of its own.
func (c *call) startAggregateRows(st *C.TF_Status) error {
	if len(c.dims) < 1 || c.dims[0] < 1 {
		return &tfrt.Error{Code: tfrt.InvalidArgument, Msg: fmt.Sprintf("aggregate rows: input of shape %v, expected one row per vote", c.dims)}
	}
	if err := c.allocateLikeInput(st); err != nil {
		return err
	}
	go c.aggregateRows()
	return nil
}

// allocateLikeInput allocates a new output of the input's type and shape.
func (c *call) allocateLikeInput(st *C.TF_Status) error {
	c.out = C.TF_AllocateOutput(c.ctx, 0, C.TF_TensorType(c.in), dimsPtr(c.dims), C.int(len(c.dims)), C.TF_TensorByteSize(c.in), st)
	return statusError(st, "allocate output")
}

// aggregateRows has the call's Aggregator combine the rows of the input
// and writes the result into every row of the output.
func (c *call) aggregateRows() {
	agg, err := c.aggregator()
	if err != nil {
		c.finish(err)
		return
	}
	in, out := float32s(tensorBytes(c.in)), float32s(tensorBytes(c.out))
	n := int(c.dims[0])
	row := len(in) / n
	votes := make([][]float32, n)
	for r := range votes {
		votes[r] = in[r*row : (r+1)*row]
	}
	if err := agg(votes, out[:row]); err != nil {
		c.finish(err)
		return
	}
	for r := 1; r < n; r++ {
		copy(out[r*row:], out[:row])
	}
	c.finish(nil)
}

// aggregate gathers every member's input and has the call's Aggregator
// write their combination into the output.
func (c *call) aggregate() {
	agg, err := c.aggregator()
	if err != nil {
		c.finish(err)
		return
	}
	in := tensorBytes(c.in)
	blocks, err := c.g.AllGather(context.Background(), c.k.name, c.dt, in, c.shape())
	if err != nil {
		c.finish(err)
		return
	}
	votes := make([][]float32, len(blocks))
	for r, b := range blocks {
		if len(b) != len(in) {
			c.finish(&tfrt.Error{Code: tfrt.InvalidArgument, Msg: fmt.Sprintf("aggregate: %s sent %d bytes, expected %d", c.g.Members()[r], len(b), len(in))})
			return
		}
		votes[r] = float32s(b)
	}
	c.finish(agg(votes, float32s(tensorBytes(c.out))))
}

// reduceOrBroadcast runs the call's all-reduce (from the input into the
// output, which is the input when TensorFlow forwarded it) or broadcast.
func (c *call) reduceOrBroadcast() {
	ctx := context.Background()
	shape := c.shape()
	if c.k.kind == kindAllReduce {
		opts := []collective.CallOption{shape}
		if c.k.wire != 0 {
			opts = append(opts, collective.Compress(c.k.wire))
		}
		if c.k.tree {
			opts = append(opts, collective.InTreeOrder())
		}
		c.finish(c.g.AllReduceTo(ctx, c.k.name, c.k.red, c.dt, tensorBytes(c.out), tensorBytes(c.in), opts...))
		return
	}
	c.finish(c.g.Broadcast(ctx, c.k.name, c.k.root, c.dt, tensorBytes(c.out), shape))
}

// gather all-gathers the input and writes the members' blocks, in rank
// order, into an output whose first dimension is their sum.
func (c *call) gather() {
	blocks, err := c.g.AllGather(context.Background(), c.k.name, c.dt, tensorBytes(c.in), c.shape())
	if err != nil {
		c.finish(err)
		return
	}
	dims := slices.Clone(c.dims)
	if len(dims) == 0 {
		c.finish(&tfrt.Error{Code: tfrt.InvalidArgument, Msg: "all-gather of a scalar: expected a tensor of rank 1 or more"})
		return
	}
	row := int64(c.dt.Size())
	for _, d := range dims[1:] {
		row *= int64(d)
	}
	total := int64(0)
	for r, b := range blocks {
		if row == 0 || int64(len(b))%row != 0 {
			c.finish(&tfrt.Error{Code: tfrt.InvalidArgument, Msg: fmt.Sprintf("all-gather: %s sent %d bytes, not whole rows of %v %s",
				c.g.Members()[r], len(b), dims[1:], c.dt)})
			return
		}
		total += int64(len(b)) / row
	}
	dims[0] = C.int64_t(total)
	st := C.TF_NewStatus()
	defer C.TF_DeleteStatus(st)
	c.out = C.TF_AllocateOutput(c.ctx, 0, C.TF_TensorType(c.in), dimsPtr(dims), C.int(len(dims)), C.size_t(total*row), st)
	if err := statusError(st, "allocate output"); err != nil {
		c.finish(err)
		return
	}
	out := tensorBytes(c.out)
	for _, b := range blocks {
		out = out[copy(out, b):]
	}
	c.finish(nil)
}

// finish records err as the op's failure, releases the tensors and tells
// TensorFlow the op is done.
func (c *call) finish(err error) {
	if err != nil {
		st := C.TF_NewStatus()
		setStatus(st, collectiveCode(err), fmt.Sprintf("tfdist %s %q: %v", kinds[c.k.kind], c.k.name, err))
		C.TF_OpKernelContext_Failure(c.ctx, st)
		C.TF_DeleteStatus(st)
	}
	if c.in != nil {
		C.TF_DeleteTensor(c.in)
	}
	if c.out != nil {
		C.TF_DeleteTensor(c.out)
	}
	C.tfdist_run_done(c.done)
}

// collectiveCode maps an engine error onto the TensorFlow status code the
// step's error carries.
func collectiveCode(err error) tfrt.Code {
	var te *tfrt.Error
	var pe *collective.PeerError
	var me *collective.MismatchError
	switch {
	case errors.As(err, &te):
		return te.Code
	case errors.As(err, &me):
		return tfrt.InvalidArgument
	case errors.Is(err, context.DeadlineExceeded):
		return tfrt.DeadlineExceeded
	case errors.As(err, &pe):
		return tfrt.Unavailable
	case errors.Is(err, collective.ErrClosed):
		return tfrt.Aborted
	}
	return tfrt.Unknown
}

// shape is the input's shape, which every member's call must agree on.
func (c *call) shape() collective.CallOption {
	s := make([]int64, len(c.dims))
	for i, d := range c.dims {
		s[i] = int64(d)
	}
	return collective.Shape(s...)
}

func tensorDims(t *C.TF_Tensor) []C.int64_t {
	dims := make([]C.int64_t, int(C.TF_NumDims(t)))
	for i := range dims {
		dims[i] = C.int64_t(C.TF_Dim(t, C.int(i)))
	}
	return dims
}

func dimsPtr(dims []C.int64_t) *C.int64_t {
	if len(dims) == 0 {
		return nil
	}
	return &dims[0]
}

// float32s views b as float32s, or copies it into aligned memory when it is
// not aligned for them.
func float32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		out := make([]float32, len(b)/4)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(b)), b)
		return out
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// tensorBytes views t's buffer, which TensorFlow owns, as bytes.
func tensorBytes(t *C.TF_Tensor) []byte {
	n := int(C.TF_TensorByteSize(t))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(C.TF_TensorData(t)), n)
}
