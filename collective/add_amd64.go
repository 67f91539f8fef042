package collective

// addFloat32AVX2 sets dst[i] = a[i] + b[i] for the first len(dst)/8*8
// elements; a and b are at least as long as dst.
//
//go:noescape
func addFloat32AVX2(dst, a, b []float32)

// addFloat32Fast adds the multiple-of-8 prefix with AVX2 and returns how
// many elements it did (0 without AVX2).
func addFloat32Fast(dst, a, b []float32) int {
	n := len(dst) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	addFloat32AVX2(dst[:n], a[:n], b[:n])
	return n
}

// addFloat32TwoAVX2 sets dst[i] and dst2[i] to a[i] + b[i] for the first
// len(dst)/8*8 elements; dst2, a and b are at least as long as dst, and
// dst2 is 32-byte aligned.
//
//go:noescape
func addFloat32TwoAVX2(dst, dst2, a, b []float32)

// addFloat32TwoFast is addFloat32Fast writing dst2 as well.
func addFloat32TwoFast(dst, dst2, a, b []float32) int {
	n := len(dst) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	addFloat32TwoAVX2(dst[:n], dst2[:n], a[:n], b[:n])
	return n
}
