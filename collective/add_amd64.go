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
