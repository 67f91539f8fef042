package engineops_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/engineops"
)

// run runs fetches from the graph of s in a session of its own.
func run(t *testing.T, s *op.Scope, fetches ...tf.Output) []*tf.Tensor {
	t.Helper()
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, fetches, nil)
	require.NoError(t, err)
	return out
}

// referenceLargest sorts positions by magnitude, largest first, the first
// position first among equals, and returns the first k in ascending order.
func referenceLargest(x []float32, k int) []int32 {
	pos := make([]int32, len(x))
	for i := range pos {
		pos[i] = int32(i)
	}
	sort.SliceStable(pos, func(a, b int) bool {
		return math.Abs(float64(x[pos[a]])) > math.Abs(float64(x[pos[b]]))
	})
	out := slices.Clone(pos[:k])
	slices.Sort(out)
	return out
}

// The op selects the positions of the k largest magnitudes, taking the
// first of equal ones, for inputs full of ties, signed zeros, infinities
// and values that differ only in their last bits, of any shape.
func TestLargestIndicesMatchesSorting(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	inputs := map[string][]float32{
		"normal":  make([]float32, 100_000),
		"ties":    make([]float32, 10_000),
		"special": {0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1, -1, 2, -2, 1e-45, -1e-45, 3},
		"ulps":    make([]float32, 5_000),
	}
	for i := range inputs["normal"] {
		inputs["normal"][i] = float32(rng.NormFloat64())
	}
	for i := range inputs["ties"] {
		inputs["ties"][i] = float32(rng.IntN(7) - 3)
	}
	for i := range inputs["ulps"] {
		inputs["ulps"][i] = math.Float32frombits(math.Float32bits(1) + uint32(rng.IntN(3)))
	}
	for name, x := range inputs {
		for _, k := range []int{1, 2, len(x) / 100, len(x) / 2, len(x) - 1, len(x)} {
			if k < 1 {
				continue
			}
			s := op.NewScope()
			shaped := op.Reshape(s, op.Const(s.SubScope("x"), x), op.Const(s.SubScope("shape"), []int32{1, -1, 1}))
			got := run(t, s, engineops.LargestIndices(s.SubScope("largest"), shaped, int64(k)))
			require.Equal(t, referenceLargest(x, k), got[0].Value().([]int32), "%s, k=%d", name, k)
		}
	}
}

// A k larger than the input fails the run, naming both.
func TestLargestIndicesRefusesTooLargeK(t *testing.T) {
	s := op.NewScope()
	out := engineops.LargestIndices(s, op.Const(s.SubScope("x"), []float32{1, 2}), 3)
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Run(nil, []tf.Output{out}, nil)
	require.ErrorContains(t, err, "largest indices: k 3 of 2 elements")
}
