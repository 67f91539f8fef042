package collective

import (
	"math"
	"sync"
)

// Conversions between float32 and the 16-bit floats: exact to float32,
// rounding to nearest, ties to even, from it. The bulk forms are what the
// engine uses (Float16 and BFloat16 reductions, Compress); they are written
// for speed: a table lookup per half decoded, and encoding loops whose
// common case is a few integer operations and one predictable branch.

// f16ToF32 converts an IEEE 754 half-precision value to float32 exactly;
// a nan comes out quiet, keeping its payload, as F16C converts it.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f && mant != 0: // nan
		return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
	case exp == 0x1f: // inf
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0: // zero, subnormal: mant × 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// f16Table holds the float32 value of every half, built on first use.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for h := range t {
		t[h] = f16ToF32(uint16(h))
	}
	return t
})

// decodeF16 converts the halves in src to float32 into dst: in hardware
// where the processor can (F16C), through a table otherwise, with the
// same bits.
func decodeF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	n := decodeF16Fast(dst, src)
	decodeF16Go(dst[n:], src[n:])
}

// decodeF16Go is decodeF16 through the table.
func decodeF16Go(dst []float32, src []uint16) {
	t := f16Table()
	for i, h := range src {
		dst[i] = t[h]
	}
}

// encodeF16 rounds src to half precision into dst, to nearest with ties
// to even: in hardware where the processor can (F16C), with the same bits.
func encodeF16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	n := encodeF16Fast(dst, src)
	encodeF16Go(dst[n:], src[n:])
}

// encodeF16Go is encodeF16 in Go.
func encodeF16Go(dst []uint16, src []float32) {
	s := bits32(src[:len(dst)])
	for i, u := range s {
		a, sign := u&0x7fffffff, uint16(u>>16)&0x8000
		if a-(127-14)<<23 < (127+16-(127-14))<<23 {
			// A normal half: rebias the exponent, round off 13 bits.
			dst[i] = sign | uint16((a-(127-15)<<23+0xfff+a>>13&1)>>13)
			continue
		}
		dst[i] = sign | uint16(f16Edge(a))
	}
}

// f16Edge encodes a float32 magnitude a outside the normal halves' range:
// zero or a subnormal half (a float addition rounds it), inf on overflow,
// or a quiet nan keeping the top of the payload.
func f16Edge(a uint32) uint32 {
	switch {
	case a < (127-14)<<23:
		return math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
	case a > 0x7f800000:
		return 0x7e00 | a>>13&0x3ff
	}
	return 0x7c00
}

// bf16 rounds the float32 bits u to bfloat16; a nan stays a nan.
func bf16(u uint32) uint16 {
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + u>>16&1) >> 16)
}

// Two float32s in a uint64, one per 32-bit lane.
const (
	lanes   = 0x0000_0001_0000_0001
	laneTop = 0x8000_0000 * lanes
)

// encodeBF16 rounds src to bfloat16 into dst: with AVX2 where the
// processor has it, else in Go, two elements per 64-bit operation while
// neither is a nan; the same bits either way.
func encodeBF16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	n := encodeBF16Fast(dst, src)
	encodeBF16Go(dst[n:], src[n:])
}

// encodeBF16Go is encodeBF16 in Go.
func encodeBF16Go(dst []uint16, src []float32) {
	s := bits32(src[:len(dst)])
	i := 0
	for ; i+1 < len(s); i += 2 {
		x := uint64(s[i]) | uint64(s[i+1])<<32
		if (x&(0x7fffffff*lanes)+0x007fffff*lanes)&laneTop != 0 { // a nan
			dst[i], dst[i+1] = bf16(s[i]), bf16(s[i+1])
			continue
		}
		x += 0x7fff*lanes + x>>16&lanes
		dst[i], dst[i+1] = uint16(x>>16), uint16(x>>48)
	}
	if i < len(s) {
		dst[i] = bf16(s[i])
	}
}

// decodeBF16 converts the bfloat16s in src to float32 into dst, with
// AVX2 where the processor has it.
func decodeBF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	n := decodeBF16Fast(dst, src)
	decodeBF16Go(dst[n:], src[n:])
}

// decodeBF16Go is decodeBF16 in Go.
func decodeBF16Go(dst []float32, src []uint16) {
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// encodeHalf rounds src into dst in wire, Float16 or BFloat16.
func encodeHalf(wire DType, dst []uint16, src []float32) {
	if wire == BFloat16 {
		encodeBF16(dst, src)
		return
	}
	encodeF16(dst, src)
}

// decodeHalf converts src, in wire (Float16 or BFloat16), into dst.
func decodeHalf(wire DType, dst []float32, src []uint16) {
	if wire == BFloat16 {
		decodeBF16(dst, src)
		return
	}
	decodeF16(dst, src)
}
