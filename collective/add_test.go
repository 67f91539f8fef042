package collective

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// addCases returns float32 operands of length n whose sums cover the IEEE
// corner cases (signed zeros, subnormals, overflow to inf, inf - inf, NaN
// payloads) among random values.
func addCases(rng *rand.Rand, n int) (a, b []float32) {
	special := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32,
		math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xffa00000), 1, -1}
	pick := func() float32 {
		if rng.IntN(4) == 0 {
			return special[rng.IntN(len(special))]
		}
		return float32(rng.NormFloat64() * 1e3)
	}
	a, b = make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i] = pick(), pick()
	}
	return a, b
}

// The float32 sum gives, bit for bit, Go's a[i] + b[i] for every length
// (the SIMD loops' 32- and 8-element blocks and the tail), into a third
// buffer, into two at once and in place: members on processors with and
// without AVX2 agree.
func TestAddFloat32MatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 1000, 4099} {
		a, b := addCases(rng, n)
		want := make([]uint32, n)
		for i := range a {
			want[i] = math.Float32bits(a[i] + b[i])
		}
		dst, dst2 := make([]float32, n), make([]float32, n)
		addFloat32(dst, a, b)
		require.Equal(t, want, bits32(dst), "n=%d", n)
		clear(dst)
		addFloat32Two(dst, dst2, a, b)
		require.Equal(t, want, bits32(dst), "n=%d, two", n)
		require.Equal(t, want, bits32(dst2), "n=%d, two's second", n)
		addFloat32(a, a, b)
		require.Equal(t, want, bits32(a), "n=%d in place", n)
	}
}

// reduceTo equals a copy followed by reduceInto, for the fused float32 sum
// and for the other reductions and dtypes, aligned or not.
func TestReduceToEqualsCopyThenReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for _, dt := range []DType{Float32, Float64, Int32, Int64, Float16, BFloat16} {
		for _, red := range []Reduction{Sum, Mean, Min, Max} {
			for _, off := range []int{0, 1} {
				n := 37 * dt.Size()
				a, b := make([]byte, n+off), make([]byte, n+off)
				for i := range a {
					a[i], b[i] = byte(rng.IntN(256)), byte(rng.IntN(256))
				}
				a, b = a[off:], b[off:]
				want := append([]byte(nil), a...)
				reduceInto(red, dt, want, b)
				got := make([]byte, n)
				reduceTo(red, dt, got, a, b)
				require.Equal(t, want, got, "%v %v offset %d", dt, red, off)
			}
		}
	}
}
