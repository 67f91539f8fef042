// Package tensorutil reads the values of fetched float32 tensors, for
// reports and tests.
package tensorutil

import (
	"bytes"
	"encoding/binary"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
)

// Float32s returns a float32 tensor of any rank as one row-major slice, or
// nil for a tensor of another type.
func Float32s(t *tf.Tensor) []float32 {
	if t.DataType() != tf.Float {
		return nil
	}
	var buf bytes.Buffer
	if _, err := t.WriteContentsTo(&buf); err != nil {
		return nil
	}
	raw := buf.Bytes()
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.NativeEndian.Uint32(raw[4*i:]))
	}
	return out
}

// SumSquares returns the sum of the squares of v, in float64.
func SumSquares(v []float32) float64 {
	var s float64
	for _, f := range v {
		s += float64(f) * float64(f)
	}
	return s
}
