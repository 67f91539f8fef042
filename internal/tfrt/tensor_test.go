package tfrt_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// ReadTensor reads back the contents WriteContentsTo wrote of a tensor of
// a dtype graft has no Go type for (on which tf.ReadTensor panics): the
// tensor it makes has the dtype, the shape and the values.
func TestReadTensorOfHalfAndBfloat16(t *testing.T) {
	want := [][]float32{{1, -2.5, 0.125}, {65504, 0, -0.5}}
	for _, dt := range []tf.DataType{tf.Half, tf.Bfloat16} {
		s := op.NewScope()
		cast := op.Cast(s, op.Const(s.SubScope("x"), want), dt)
		narrow := run(t, s, nil, cast)[0]
		var buf bytes.Buffer
		_, err := narrow.WriteContentsTo(&buf)
		require.NoError(t, err)

		got, err := tfrt.ReadTensor(dt, []int64{2, 3}, &buf)
		require.NoError(t, err, dt)
		assert.Equal(t, dt, got.DataType())
		assert.Equal(t, []int64{2, 3}, got.Shape())

		s = op.NewScope()
		in := op.Placeholder(s, dt)
		wide := op.Cast(s, in, tf.Float)
		g, err := s.Finalize()
		require.NoError(t, err)
		sess, err := tf.NewSession(g, nil)
		require.NoError(t, err)
		out, err := sess.Run(map[tf.Output]*tf.Tensor{in: got}, []tf.Output{wide}, nil)
		require.NoError(t, err)
		require.NoError(t, sess.Close())
		if dt == tf.Half {
			assert.Equal(t, want, out[0].Value(), "half holds these exactly")
		} else {
			assert.Equal(t, float32(1), out[0].Value().([][]float32)[0][0])
		}
	}
}

// ReadTensor of dtypes graft reads itself, and of every size, is
// tf.ReadTensor's; an empty tensor and a scalar too.
func TestReadTensorShapes(t *testing.T) {
	for _, c := range []struct {
		dt    tf.DataType
		shape []int64
		size  int
	}{{tf.Half, nil, 2}, {tf.Half, []int64{0, 3}, 0}, {tf.Int4, []int64{3}, 3}, {tf.Float, []int64{2}, 8}, {tf.Quint8, []int64{4}, 4}} {
		got, err := tfrt.ReadTensor(c.dt, c.shape, bytes.NewReader(make([]byte, c.size)))
		require.NoError(t, err, c.dt)
		assert.Equal(t, c.dt, got.DataType())
		assert.Equal(t, c.shape, got.Shape())
		var buf bytes.Buffer
		_, err = got.WriteContentsTo(&buf)
		require.NoError(t, err)
		assert.Equal(t, c.size, buf.Len(), "dtype %d shape %v", c.dt, c.shape)
	}
	_, err := tfrt.ReadTensor(tf.Half, []int64{2}, bytes.NewReader([]byte{1, 2, 3}))
	assert.Error(t, err, "too few bytes")
}
