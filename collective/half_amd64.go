package collective

// hasF16C reports whether the processor converts between float32 and
// float16 in hardware (F16C, with AVX enabled by the operating system).
var hasF16C = cpuHasF16C()

func cpuHasF16C() bool

// hasAVX2 reports whether the processor has AVX2, enabled by the
// operating system, for the bfloat16 conversions.
var hasAVX2 = cpuHasAVX2()

func cpuHasAVX2() bool

// encodeBF16AVX2 and decodeBF16AVX2 convert len(src)/8*8 elements with
// AVX2, as encodeBF16 and decodeBF16 do.
//
//go:noescape
func encodeBF16AVX2(dst []uint16, src []float32)

//go:noescape
func decodeBF16AVX2(dst []float32, src []uint16)

// encodeBF16Fast encodes the multiple-of-8 prefix of src with AVX2 and
// returns how many elements it did.
func encodeBF16Fast(dst []uint16, src []float32) int {
	return simdPrefix(hasAVX2, encodeBF16AVX2, dst, src)
}

// decodeBF16Fast decodes the multiple-of-8 prefix of src with AVX2 and
// returns how many elements it did.
func decodeBF16Fast(dst []float32, src []uint16) int {
	return simdPrefix(hasAVX2, decodeBF16AVX2, dst, src)
}

// encodeF16C and decodeF16C convert len(src)/8*8 elements with F16C's
// VCVTPS2PH (rounding to nearest, ties to even) and VCVTPH2PS.
//
//go:noescape
func encodeF16C(dst []uint16, src []float32)

//go:noescape
func decodeF16C(dst []float32, src []uint16)

// encodeF16Fast encodes the multiple-of-8 prefix of src in hardware and
// returns how many elements it did.
func encodeF16Fast(dst []uint16, src []float32) int { return simdPrefix(hasF16C, encodeF16C, dst, src) }

// decodeF16Fast decodes the multiple-of-8 prefix of src in hardware and
// returns how many elements it did.
func decodeF16Fast(dst []float32, src []uint16) int { return simdPrefix(hasF16C, decodeF16C, dst, src) }

// simdPrefix runs conv, which converts 8 elements at a time, on the
// multiple-of-8 prefix of src into dst when the processor can (ok), and
// returns the prefix's length (0 when it cannot).
func simdPrefix[D, S any](ok bool, conv func([]D, []S), dst []D, src []S) int {
	n := min(len(dst), len(src)) &^ 7
	if !ok || n == 0 {
		return 0
	}
	conv(dst[:n], src[:n])
	return n
}
