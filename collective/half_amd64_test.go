package collective

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// simdConversion is a conversion between float32 and a 16-bit type in
// SIMD instructions, and the Go code it stands in for.
type simdConversion struct {
	name               string
	has                bool
	encodeHW, encodeGo func([]uint16, []float32)
	decodeHW, decodeGo func([]float32, []uint16)
}

var simdConversions = []simdConversion{
	{"float16 (F16C)", hasF16C, encodeF16C, encodeF16Go, decodeF16C, decodeF16Go},
	{"bfloat16 (AVX2)", hasAVX2, encodeBF16AVX2, encodeBF16Go, decodeBF16AVX2, decodeBF16Go},
}

// The SIMD conversions give Go's bits: in encoding, for float32s of both
// signs of every exponent where the rounding changes kind — 0 and 1
// (zeros, subnormals), 101 to 103 (to zero or the smallest half
// subnormals; every mantissa of 102), 111 to 114 (to subnormal or normal
// halves), 126 and 127, 141 to 143 (the largest halves, overflow), 254
// and 255 (the largest floats, inf, nans) — with every value of the
// mantissa's low 17 bits (all a rounding reads elsewhere) under four
// patterns of its top 6, and for 4 M float32s drawn at random; in
// decoding, for every 16-bit value.
func TestSIMDConversionsMatchGo(t *testing.T) {
	exps := []uint32{0, 1, 101, 102, 103, 111, 112, 113, 114, 126, 127, 141, 142, 143, 254, 255}
	for _, c := range simdConversions {
		t.Run(c.name, func(t *testing.T) {
			if !c.has {
				t.Skipf("this processor cannot run %s: the conversions are Go's alone", c.name)
			}
			for _, sign := range []uint32{0, 1 << 31} {
				for _, e := range exps {
					if e == 102 {
						c.requireSameEncoding(t, func(i uint32) uint32 { return sign | e<<23 | i }, 1<<23)
						continue
					}
					for _, top := range []uint32{0, 0x15, 0x2a, 0x3f} {
						c.requireSameEncoding(t, func(i uint32) uint32 { return sign | e<<23 | top<<17 | i }, 1<<17)
					}
				}
			}
			r := rand.New(rand.NewPCG(1, 2))
			c.requireSameEncoding(t, func(uint32) uint32 { return r.Uint32() }, 1<<22)
			c.requireSameDecoding(t)
		})
	}
}

// requireSameEncoding encodes the float32s of bits bits(0), …, bits(n-1)
// both ways, and fails at the first that differ.
func (c simdConversion) requireSameEncoding(t *testing.T, bits func(uint32) uint32, n uint32) {
	src := make([]float32, n)
	for i := range src {
		src[i] = math.Float32frombits(bits(uint32(i)))
	}
	hw, sw := make([]uint16, n), make([]uint16, n)
	c.encodeHW(hw, src)
	c.encodeGo(sw, src)
	for i := range hw {
		if hw[i] != sw[i] {
			require.Failf(t, "encode differs", "float32 bits %#08x: SIMD %#04x, Go %#04x", math.Float32bits(src[i]), hw[i], sw[i])
		}
	}
}

func (c simdConversion) requireSameDecoding(t *testing.T) {
	halves := make([]uint16, 1<<16)
	for h := range halves {
		halves[h] = uint16(h)
	}
	hw, sw := make([]float32, len(halves)), make([]float32, len(halves))
	c.decodeHW(hw, halves)
	c.decodeGo(sw, halves)
	for h := range halves {
		require.Equal(t, math.Float32bits(sw[h]), math.Float32bits(hw[h]), "16-bit value %#04x", h)
	}
}
