package collective

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFloat16SpecialValues(t *testing.T) {
	cases := []struct {
		name string
		in   float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3c00},
		{"max", 65504, 0x7bff},
		{"overflow to inf", 65520, 0x7c00},
		{"below overflow rounds to max", 65519, 0x7bff},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"negative inf", float32(math.Inf(-1)), 0xfc00},
		{"smallest normal", 1.0 / (1 << 14), 0x0400},
		{"smallest subnormal", 1.0 / (1 << 24), 0x0001},
		{"largest subnormal", 1023.0 / (1 << 24), 0x03ff},
		{"half of smallest subnormal ties to zero", 1.0 / (1 << 25), 0x0000},
		{"above half of smallest subnormal", 1.5 / (1 << 25), 0x0001},
		{"subnormal tie to even up", 1.5 / (1 << 24), 0x0002},
		{"subnormal tie to even down", 2.5 / (1 << 24), 0x0002},
		{"tie to even down", 1 + 1.0/(1<<11), 0x3c00},
		{"tie to even up", 1 + 3.0/(1<<11), 0x3c02},
		{"rounds up into smallest normal", 1023.75 / (1 << 24), 0x0400},
		{"float32 subnormal to zero", math.Float32frombits(1), 0x0000},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, f32ToF16(c.in), "%s: f32ToF16(%g)", c.name, c.in)
	}
	h := f32ToF16(float32(math.NaN()))
	assert.True(t, isNaN16(h), "NaN stays NaN: %#04x", h)
	assert.True(t, math.IsNaN(float64(f16ToF32(0x7e00))))
	assert.True(t, math.IsNaN(float64(f16ToF32(0x7c01))), "signalling NaN stays NaN")
}

// The scalar conversions are one-element calls of the bulk ones.

func f32ToF16(f float32) uint16 {
	var h [1]uint16
	encodeF16(h[:], []float32{f})
	return h[0]
}

func bf16ToF32(h uint16) float32 {
	var f [1]float32
	decodeBF16(f[:], []uint16{h})
	return f[0]
}

func f32ToBF16(f float32) uint16 {
	var h [1]uint16
	encodeBF16(h[:], []float32{f})
	return h[0]
}

func isNaN16(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

func isNaNBF16(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }

// roundTrip decodes every 16-bit value of wire in bulk and encodes the
// results back.
func roundTrip(wire DType) (all, back []uint16, f []float32) {
	all, back, f = make([]uint16, 1<<16), make([]uint16, 1<<16), make([]float32, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	decodeHalf(wire, f, all)
	encodeHalf(wire, back, f)
	return all, back, f
}

func TestFloat16RoundTripsEveryValue(t *testing.T) {
	all, back, f := roundTrip(Float16)
	for i, h := range all {
		require.Equal(t, math.Float32bits(f16ToF32(h)), math.Float32bits(f[i]), "%#04x decodes as f16ToF32 does", h)
		if isNaN16(h) {
			require.True(t, isNaN16(back[i]), "%#04x", h)
			continue
		}
		require.Equal(t, h, back[i], "%#04x → %g", h, f[i])
	}
}

// randomBits returns n float32s of random bits masked by mask.
func randomBits(seed uint64, n int, mask uint32) []float32 {
	rng := rand.New(rand.NewPCG(seed, seed))
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = math.Float32frombits(rng.Uint32() & mask)
	}
	return xs
}

// TestFloat16RoundsToNearestEven checks random float32s against the two
// neighbouring halves: the result is the nearer one, the even one on a tie.
func TestFloat16RoundsToNearestEven(t *testing.T) {
	xs := randomBits(2, 200001, 0xc77fffff) // |x| < 65536, either sign
	hs := make([]uint16, len(xs))
	encodeF16(hs, xs)
	for i, x := range xs {
		checkNearest(t, float64(x), hs[i], f16ToF32)
	}
}

func checkNearest(t *testing.T, x float64, h uint16, up func(uint16) float32) {
	t.Helper()
	got := float64(up(h))
	if math.IsInf(got, 0) { // overflow: inf stands for the value one ulp past the largest finite
		top := float64(up(h - 1))
		got = math.Copysign(2*top-float64(up(h-2)), got)
	}
	for _, nb := range []uint16{h - 1, h + 1} {
		v := float64(up(nb))
		if math.IsInf(v, 0) || math.IsNaN(v) || nb&0x8000 != h&0x8000 {
			continue
		}
		dg, dn := math.Abs(x-got), math.Abs(x-v)
		require.True(t, dg < dn || (dg == dn && h&1 == 0), "x=%g got %#04x (%g), neighbour %#04x (%g) is nearer", x, h, got, nb, v)
	}
}

func TestBFloat16(t *testing.T) {
	assert.Equal(t, uint16(0x3f80), f32ToBF16(1))
	assert.Equal(t, uint16(0x7f80), f32ToBF16(float32(math.Inf(1))))
	assert.Equal(t, uint16(0xff80), f32ToBF16(float32(math.Inf(-1))))
	assert.Equal(t, uint16(0x7f80), f32ToBF16(math.MaxFloat32), "overflow rounds to inf")
	assert.Equal(t, uint16(0x0001), f32ToBF16(math.Float32frombits(0x00010000)), "subnormal kept")
	assert.Equal(t, uint16(0x3f80), f32ToBF16(math.Float32frombits(0x3f808000)), "tie to even down")
	assert.Equal(t, uint16(0x3f82), f32ToBF16(math.Float32frombits(0x3f818000)), "tie to even up")
	assert.True(t, math.IsNaN(float64(bf16ToF32(f32ToBF16(float32(math.NaN()))))))
	assert.True(t, math.IsNaN(float64(bf16ToF32(f32ToBF16(math.Float32frombits(0x7f800001))))), "low-payload NaN stays NaN")
	all, back, _ := roundTrip(BFloat16)
	for i, h := range all {
		if !isNaNBF16(h) {
			require.Equal(t, h, back[i], "%#04x", h)
		}
	}
	xs := randomBits(4, 200001, 0xff7fffff)
	hs := make([]uint16, len(xs))
	encodeBF16(hs, xs)
	for i, x := range xs {
		checkNearest(t, float64(x), hs[i], bf16ToF32)
	}
}

// Encoding two bfloat16s at a time gives what one at a time gives, nans
// among them included.
func TestBFloat16InBulk(t *testing.T) {
	nan, quiet := math.Float32frombits(0x7f800001), float32(math.NaN())
	xs := []float32{1.5, nan, -quiet, 3, nan, quiet, float32(math.Inf(-1)), 0x1p-130, -2.75}
	for n := range len(xs) + 1 {
		hs := make([]uint16, n)
		encodeBF16(hs, xs[:n])
		for i, x := range xs[:n] {
			require.Equal(t, f32ToBF16(x), hs[i], "element %d of %d", i, n)
		}
	}
	assert.True(t, isNaNBF16(f32ToBF16(nan)))
}
