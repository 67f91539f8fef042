package tensorutil_test

import (
	"runtime"
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
		{[][][][]float32{{{{1}, {2}}}, {{{3}, {4}}}}, []float32{1, 2, 3, 4}},
		{[]float32{}, []float32{}},
		{[]int32{1}, nil},
	} {
		x, err := tf.NewTensor(c.in)
		require.NoError(t, err)
		assert.Equal(t, c.want, tensorutil.Float32s(x))
	}
}

func TestFloat64s(t *testing.T) {
	x, err := tf.NewTensor([][]float64{{1, -2.5}, {3, 1e300}})
	require.NoError(t, err)
	assert.Equal(t, []float64{1, -2.5, 3, 1e300}, tensorutil.Float64s(x))
	f, err := tf.NewTensor([]float32{1})
	require.NoError(t, err)
	assert.Nil(t, tensorutil.Float64s(f))
}

func TestSumSquares(t *testing.T) {
	assert.Equal(t, 25.0, tensorutil.SumSquares([]float32{3, -4}))
	assert.Zero(t, tensorutil.SumSquares[float32](nil))
	assert.Equal(t, 2e200, tensorutil.SumSquares([]float64{1e100, 1e100}))
}

// Values read from tensors nothing else refers to are right while the
// collector runs finalizers all along: the tensor stays alive until it is
// decoded.
func TestValueOfUnreferencedTensors(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	want := make([]float32, 1<<14)
	for i := range want {
		want[i] = float32(i)
	}
	for range 200 {
		got := tensorutil.Value(newTensor(t, want)).([]float32)
		require.Equal(t, want, got)
		require.Equal(t, want, tensorutil.Float32s(newTensor(t, want)))
	}
}

func newTensor(t *testing.T, v []float32) *tf.Tensor {
	x, err := tf.NewTensor(v)
	require.NoError(t, err)
	return x
}
