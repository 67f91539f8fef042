package engineops

// #include <stdint.h>
// #include "kernels.h"
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tfrt"
)

const opLargest = "TfdistLargestIndices"

// LargestIndices adds an op whose output (int32, [k]) holds, in ascending
// order, the positions in in (float32, any shape, read flat) of its k
// elements largest in magnitude; among equal magnitudes, the first ones.
// It is TopKV2's selection of Abs(in) without the sort, in time linear in
// in's size (two counting passes over the magnitudes' bits, then one to
// collect), an order of magnitude faster on millions of elements.
func LargestIndices(s *op.Scope, in tf.Output, k int64) tf.Output {
	if err := registerOps(); err != nil {
		s.UpdateErr(opLargest, err)
		return tf.Output{}
	}
	o := s.AddOperation(tf.OpSpec{Type: opLargest, Input: []tf.Input{in}, Attrs: map[string]any{"k": k}})
	if o == nil {
		return tf.Output{}
	}
	return o.Output(0)
}

// startLargest allocates the call's [k] output and selects its indices on
// a goroutine of its own.
func (c *call) startLargest(st *C.TF_Status) error {
	n := int64(C.TF_TensorElementCount(c.in))
	if c.k.k > n {
		return &tfrt.Error{Code: tfrt.InvalidArgument, Msg: fmt.Sprintf("largest indices: k %d of %d elements", c.k.k, n)}
	}
	dims := []C.int64_t{C.int64_t(c.k.k)}
	c.out = C.TF_AllocateOutput(c.ctx, 0, C.TF_INT32, dimsPtr(dims), 1, C.size_t(4*c.k.k), st)
	if err := statusError(st, "allocate output"); err != nil {
		return err
	}
	go func() {
		out := tensorBytes(c.out)
		largestIndices(float32s(tensorBytes(c.in)), unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(out))), len(out)/4))
		c.finish(nil)
	}()
	return nil
}

// largestIndices fills idx, in ascending order, with the positions of the
// len(idx) elements of x largest in magnitude, the first ones among equal
// magnitudes. A magnitude's bits (the sign cleared) order as the
// magnitudes do, NaNs above infinity: the high 16 bits find the bucket
// that holds the len(idx)-th largest, the low 16 bits of that bucket's
// elements the exact threshold and how many of its equals to take.
func largestIndices(x []float32, idx []int32) {
	if len(idx) == 0 {
		return
	}
	var hist [1 << 16]int32
	for _, v := range x {
		hist[magnitude(v)>>16]++
	}
	hi, need := kth(&hist, int32(len(idx)))
	clear(hist[:])
	for _, v := range x {
		if m := magnitude(v); m>>16 == hi {
			hist[m&0xffff]++
		}
	}
	lo, ties := kth(&hist, need)
	threshold := hi<<16 | lo
	n := 0
	for i, v := range x {
		switch m := magnitude(v); {
		case m > threshold:
		case m == threshold && ties > 0:
			ties--
		default:
			continue
		}
		idx[n] = int32(i)
		n++
	}
}

// kth returns the bucket of hist, counting down from the top, that holds
// the need-th element, and how many of that bucket's elements are needed.
func kth(hist *[1 << 16]int32, need int32) (bucket uint32, rest int32) {
	for b := len(hist) - 1; b > 0; b-- {
		if hist[b] >= need {
			return uint32(b), need
		}
		need -= hist[b]
	}
	return 0, need
}

func magnitude(v float32) uint32 { return math.Float32bits(v) &^ (1 << 31) }
