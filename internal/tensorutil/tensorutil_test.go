package tensorutil_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
)

func TestFloat32s(t *testing.T) {
	for _, c := range []struct {
		in   any
		want []float32
	}{
		{float32(2), []float32{2}},
		{[]float32{1, 2}, []float32{1, 2}},
		{[][]float32{{1, 2}, {3, 4}}, []float32{1, 2, 3, 4}},
		{[][][]float32{{{1, 2}}, {{3, 4}}}, []float32{1, 2, 3, 4}},
		{[]int32{1}, nil},
	} {
		x, err := tf.NewTensor(c.in)
		require.NoError(t, err)
		assert.Equal(t, c.want, tensorutil.Float32s(x))
	}
}
