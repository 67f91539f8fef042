package collective

import (
	"unsafe"
)

// Buffers are read in the host's byte order, which the engine assumes is
// little-endian on every member (TensorFlow's layout on amd64 and arm64).

type number interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~int8
}

// view returns b as a []T; b must be aligned for T.
func view[T number | uint16](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// bytesOf returns the bytes of s, sharing its memory.
func bytesOf[T number | uint64](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), int(unsafe.Sizeof(z))*len(s))
}

// bits32 returns the bits of f's elements, sharing its memory.
func bits32(f []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(f))), len(f))
}

func aligned(b []byte, size int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(size) == 0
}

// reduceInto sets dst[i] = dst[i] ∘ src[i] element-wise (Mean sums; the
// division is scale's). len(src) == len(dst).
func reduceInto(red Reduction, dt DType, dst, src []byte) {
	if len(dst) == 0 {
		return
	}
	size := dt.Size()
	if !aligned(dst, size) || !aligned(src, size) {
		reduceUnaligned(red, dt, dst, src)
		return
	}
	switch dt {
	case Float32:
		reduceFloat32(red, view[float32](dst), view[float32](src))
	case Float64:
		reduceTyped(red, view[float64](dst), view[float64](src))
	case Int32:
		reduceTyped(red, view[int32](dst), view[int32](src))
	case Int64:
		reduceTyped(red, view[int64](dst), view[int64](src))
	case Int8:
		reduceTyped(red, view[int8](dst), view[int8](src))
	case Float16, BFloat16:
		reduceHalf(red, dt, view[uint16](dst), view[uint16](src))
	}
}

// reduceTo sets dst[i] = a[i] ∘ b[i] element-wise: in one pass for a
// float32 sum, else as a copy of a then reduceInto, or, when dst is b,
// as reduceInto of a (b ∘ a, the same but for which of two NaNs a min or
// max keeps). dst is a, b, or disjoint from both; all three have the same
// length.
func reduceTo(red Reduction, dt DType, dst, a, b []byte) {
	if addsInOnePass(red, dt, dst, a, b) {
		addFloat32(view[float32](dst), view[float32](a), view[float32](b))
		return
	}
	if len(dst) > 0 && unsafe.SliceData(dst) == unsafe.SliceData(b) {
		reduceInto(red, dt, dst, a)
		return
	}
	copyIfDistinct(dst, a)
	reduceInto(red, dt, dst, b)
}

// addsInOnePass reports whether reduceTo reduces in one pass, reading each
// element of a and b before it writes dst's: dst may then be b as well.
func addsInOnePass(red Reduction, dt DType, dst, a, b []byte) bool {
	return dt == Float32 && (red == Sum || red == Mean) && aligned(dst, 4) && aligned(a, 4) && aligned(b, 4)
}

// addFloat32 sets dst[i] = a[i] + b[i], in SIMD instructions where the
// processor has them: each sum is the same IEEE addition, so the bits do
// not depend on the path.
func addFloat32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	i := addFloat32Fast(dst, a, b)
	for ; i < len(dst); i++ {
		dst[i] = a[i] + b[i]
	}
}

// addFloat32Two is addFloat32 writing every sum into dst2 as well, in the
// same pass, past dst2's cache (dst2 is for another process to read
// later).
func addFloat32Two(dst, dst2, a, b []float32) {
	dst2, a, b = dst2[:len(dst)], a[:len(dst)], b[:len(dst)]
	add := func(i, j int) {
		for ; i < j; i++ {
			dst[i] = a[i] + b[i]
			dst2[i] = dst[i]
		}
	}
	i := 0
	for i < len(dst) && uintptr(unsafe.Pointer(&dst2[i]))%32 != 0 {
		i++
	}
	add(0, i)
	n := addFloat32TwoFast(dst[i:], dst2[i:], a[i:], b[i:])
	add(i+n, len(dst))
}

// reduceUnaligned reduces through aligned copies.
func reduceUnaligned(red Reduction, dt DType, dst, src []byte) {
	d, s := alignedCopy(dst), alignedCopy(src)
	reduceInto(red, dt, d, s)
	copy(dst, d)
}

func alignedCopy(b []byte) []byte {
	c := bytesOf(make([]uint64, (len(b)+7)/8))[:len(b)]
	copy(c, b)
	return c
}

// reduceFloat32 is reduceTyped for float32, whose sums run in SIMD
// instructions where the processor has them (addFloat32).
func reduceFloat32(red Reduction, dst, src []float32) {
	if red == Sum || red == Mean {
		addFloat32(dst, dst, src)
		return
	}
	reduceTyped(red, dst, src)
}

func reduceTyped[T number](red Reduction, dst, src []T) {
	switch red {
	case Sum, Mean:
		addInto(dst, src)
	case Min:
		minInto(dst, src)
	case Max:
		maxInto(dst, src)
	}
}

// addInto adds src to dst, unrolled by 8.
func addInto[T number](dst, src []T) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d, s := dst[i:i+8:i+8], src[i:i+8:i+8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// minInto keeps the smaller element; a NaN on either side wins.
func minInto[T number](dst, src []T) {
	src = src[:len(dst)]
	for i, s := range src {
		if s < dst[i] || s != s {
			dst[i] = s
		}
	}
}

// maxInto keeps the larger element; a NaN on either side wins.
func maxInto[T number](dst, src []T) {
	src = src[:len(dst)]
	for i, s := range src {
		if s > dst[i] || s != s {
			dst[i] = s
		}
	}
}

// halfBlock is how many 16-bit floats are widened to float32 at a time,
// in scratch on the stack.
const halfBlock = 256

// reduceHalf reduces 16-bit floats of type dt in float32 and rounds each
// result back.
func reduceHalf(red Reduction, dt DType, dst, src []uint16) {
	var a, b [halfBlock]float32
	for lo := 0; lo < len(dst); lo += halfBlock {
		d, s := dst[lo:min(lo+halfBlock, len(dst))], src[lo:]
		x, y := a[:len(d)], b[:len(d)]
		decodeHalf(dt, x, d)
		decodeHalf(dt, y, s)
		reduceFloat32(red, x, y)
		encodeHalf(dt, d, x)
	}
}

// scale divides every element of buf by n (the second half of Mean).
func scale(dt DType, buf []byte, n int) {
	if len(buf) == 0 || n == 1 {
		return
	}
	if !aligned(buf, dt.Size()) {
		c := alignedCopy(buf)
		scale(dt, c, n)
		copy(buf, c)
		return
	}
	switch dt {
	case Float32:
		divide(view[float32](buf), float32(n))
	case Float64:
		divide(view[float64](buf), float64(n))
	case Int32:
		divide(view[int32](buf), int32(n))
	case Int64:
		divide(view[int64](buf), int64(n))
	case Int8:
		divide(view[int8](buf), int8(n))
	case Float16, BFloat16:
		divideHalf(dt, view[uint16](buf), float32(n))
	}
}

func divide[T number](buf []T, n T) {
	for i := range buf {
		buf[i] /= n
	}
}

// divideHalf divides 16-bit floats of type dt by n in float32.
func divideHalf(dt DType, buf []uint16, n float32) {
	var a [halfBlock]float32
	for lo := 0; lo < len(buf); lo += halfBlock {
		b := buf[lo:min(lo+halfBlock, len(buf))]
		x := a[:len(b)]
		decodeHalf(dt, x, b)
		divide(x, n)
		encodeHalf(dt, b, x)
	}
}

// reduceWire reduces a compressed chunk w (16-bit floats of type wire) with
// local in float32 and rounds the result into to, which may be w. When out
// is given (the last step of a segment's reduction), Mean's division by n
// comes before the rounding, and out receives the rounded result in
// float32.
func reduceWire(red Reduction, wire DType, to, w []uint16, local, out []float32, n int) {
	var a [halfBlock]float32
	for lo := 0; lo < len(w); lo += halfBlock {
		hi := min(lo+halfBlock, len(w))
		x := a[:hi-lo]
		decodeHalf(wire, x, w[lo:hi])
		reduceFloat32(red, x, local[lo:])
		if out != nil && red == Mean {
			divide(x, float32(n))
		}
		encodeHalf(wire, to[lo:hi], x)
		if out != nil {
			decodeHalf(wire, out[lo:hi], to[lo:hi])
		}
	}
}
