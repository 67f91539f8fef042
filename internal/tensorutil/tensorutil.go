// Package tensorutil reads the values of fetched float32 tensors, for
// reports and tests.
package tensorutil

import (
	"bytes"
	"encoding/binary"

	tf "github.com/wamuir/graft/tensorflow"
)

// Float32s returns a float32 tensor of any rank as one row-major slice,
// or nil for a tensor of another type.
func Float32s(t *tf.Tensor) []float32 {
	switch v := t.Value().(type) {
	case float32:
		return []float32{v}
	case []float32:
		return v
	case [][]float32:
		var out []float32
		for _, r := range v {
			out = append(out, r...)
		}
		return out
	}
	if t.DataType() != tf.Float {
		return nil
	}
	var buf bytes.Buffer
	if _, err := t.WriteContentsTo(&buf); err != nil {
		return nil
	}
	out := make([]float32, buf.Len()/4)
	if err := binary.Read(&buf, binary.NativeEndian, out); err != nil {
		return nil
	}
	return out
}
