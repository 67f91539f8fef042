package dataset

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
)

// TestPiecesReadAsTheirJoinedData checks that batch data kept as pieces
// reads, slices, joins and becomes a tensor exactly as the one array it
// stands for, with parts of any length (empty ones included) and slices
// within a part, across parts and empty.
func TestPiecesReadAsTheirJoinedData(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	k := kinds[tf.Float]
	for trial := range 50 {
		var parts []any
		flat := []float32{}
		for range 1 + rng.IntN(6) {
			p := make([]float32, rng.IntN(5))
			for i := range p {
				p[i] = float32(len(flat) + i)
			}
			flat = append(flat, p...)
			parts = append(parts, p)
		}
		ps := joinPieces([]any{joinPieces(parts[:1], len(parts[0].([]float32))), pieces{parts[1:], len(flat) - len(parts[0].([]float32))}}, len(flat))
		require.Len(t, ps.parts, len(parts), "trial %d: nested pieces join into one level", trial)
		require.Equal(t, flat, k.flat(ps), "trial %d", trial)
		require.Equal(t, append(append([]float32{}, flat...), flat...), k.concat([]any{ps, flat}, 2*len(flat)), "trial %d", trial)
		for lo := 0; lo <= len(flat); lo++ {
			for hi := lo; hi <= len(flat); hi++ {
				s := k.sliceData(ps, lo, hi)
				require.Equal(t, flat[lo:hi], k.flat(s), "trial %d: [%d, %d)", trial, lo, hi)
				tt, err := k.toTensor(s, []int64{int64(hi - lo)})
				require.NoError(t, err)
				require.Equal(t, flat[lo:hi], tt.Value(), "trial %d: tensor of [%d, %d)", trial, lo, hi)
			}
		}
	}
	// A dtype that is not copied as raw memory joins its pieces first.
	s := kinds[tf.String]
	tt, err := s.toTensor(pieces{[]any{[]string{"a", "b"}, []string{"c"}}, 3}, []int64{3})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, tt.Value())
}
