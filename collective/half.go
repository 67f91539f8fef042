package collective

import "math"

// f16ToF32 converts an IEEE 754 half-precision value to float32 exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // inf, nan
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0: // zero, subnormal: mant × 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// f32ToF16 rounds f to the nearest half-precision value, ties to even.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		return sign | f16Subnormal(mant|0x800000, e)
	}
	return sign | uint16(roundShift(uint32(e)<<23|mant, 13))
}

// f16Subnormal rounds the 24-bit significand m of a float32 whose half
// exponent e <= 0 to a half subnormal (which may round up to the smallest
// normal).
func f16Subnormal(m uint32, e int) uint16 {
	if e < -10 {
		return 0
	}
	return uint16(roundShift(m, uint(14-e)))
}

// roundShift returns x >> s rounded to nearest, ties to even (0 < s < 32).
func roundShift(x uint32, s uint) uint32 {
	q := x >> s
	rem := x & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// bf16ToF32 converts a bfloat16 value to float32 exactly.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f32ToBF16 rounds f to the nearest bfloat16 value, ties to even.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // nan: keep it quiet
		return uint16(b>>16) | 0x40
	}
	return uint16(roundShift(b, 16))
}
