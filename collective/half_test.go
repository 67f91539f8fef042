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

func isNaN16(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

func TestFloat16RoundTripsEveryValue(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := f32ToF16(f16ToF32(h))
		if isNaN16(h) {
			require.True(t, isNaN16(got), "%#04x", h)
			continue
		}
		require.Equal(t, h, got, "%#04x → %g", h, f16ToF32(h))
	}
}

// TestFloat16RoundsToNearestEven checks random float32s against the two
// neighbouring halves: the result is the nearer one, the even one on a tie.
func TestFloat16RoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		x := math.Float32frombits(rng.Uint32() & 0xc77fffff) // |x| < 65536, either sign
		checkNearest(t, float64(x), f32ToF16(x), f16ToF32)
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
	for i := range 1 << 16 {
		h := uint16(i)
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			continue
		}
		require.Equal(t, h, f32ToBF16(bf16ToF32(h)), "%#04x", h)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		x := math.Float32frombits(rng.Uint32() & 0xff7fffff)
		checkNearest(t, float64(x), f32ToBF16(x), bf16ToF32)
	}
}
