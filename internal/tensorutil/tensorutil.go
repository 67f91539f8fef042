// Package tensorutil reads the values of fetched tensors.
package tensorutil

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"

	tf "github.com/wamuir/graft/tensorflow"
)

// Value returns t's value as graft's Tensor.Value does, keeping t alive
// until it is decoded: Tensor.Value reads the tensor's C memory after its
// last use of t, so when the caller does not use t afterwards either (as in
// out[0].Value()), t's finalizer may free that memory mid-read.
func Value(t *tf.Tensor) any {
	defer runtime.KeepAlive(t)
	return t.Value()
}

// Float32s returns a float32 tensor of any rank as one row-major slice, or
// nil for a tensor of another type.
func Float32s(t *tf.Tensor) []float32 {
	return floats(t, tf.Float, 4, func(b []byte) float32 {
		return math.Float32frombits(binary.NativeEndian.Uint32(b))
	})
}

// Float64s returns a float64 tensor of any rank as one row-major slice, or
// nil for a tensor of another type.
func Float64s(t *tf.Tensor) []float64 {
	return floats(t, tf.Double, 8, func(b []byte) float64 {
		return math.Float64frombits(binary.NativeEndian.Uint64(b))
	})
}

// floats decodes the contents of t, of type dt with size-byte elements.
func floats[T float32 | float64](t *tf.Tensor, dt tf.DataType, size int, decode func([]byte) T) []T {
	if t.DataType() != dt {
		return nil
	}
	var buf bytes.Buffer
	_, err := t.WriteContentsTo(&buf)
	runtime.KeepAlive(t) // WriteContentsTo reads C memory after its last use of t
	if err != nil {
		return nil
	}
	raw := buf.Bytes()
	out := make([]T, len(raw)/size)
	for i := range out {
		out[i] = decode(raw[size*i:])
	}
	return out
}

// SumSquares returns the sum of the squares of v, in float64.
func SumSquares[T float32 | float64](v []T) float64 {
	var s float64
	for _, f := range v {
		s += float64(f) * float64(f)
	}
	return s
}

// NumElements returns the number of elements of a tensor of shape, whose
// dimensions are all known.
func NumElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}
