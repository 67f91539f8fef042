package collective

import (
	"unsafe"
)

// Buffers are read in the host's byte order, which the engine assumes is
// little-endian on every member (TensorFlow's layout on amd64 and arm64).

type number interface {
	~float32 | ~float64 | ~int32 | ~int64
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
		reduceTyped(red, view[float32](dst), view[float32](src))
	case Float64:
		reduceTyped(red, view[float64](dst), view[float64](src))
	case Int32:
		reduceTyped(red, view[int32](dst), view[int32](src))
	case Int64:
		reduceTyped(red, view[int64](dst), view[int64](src))
	case Float16:
		reduceHalf(red, view[uint16](dst), view[uint16](src), f16ToF32, f32ToF16)
	case BFloat16:
		reduceHalf(red, view[uint16](dst), view[uint16](src), bf16ToF32, f32ToBF16)
	}
}

// reduceUnaligned reduces through aligned copies.
func reduceUnaligned(red Reduction, dt DType, dst, src []byte) {
	d, s := alignedCopy(dst), alignedCopy(src)
	reduceInto(red, dt, d, s)
	copy(dst, d)
}

func alignedCopy(b []byte) []byte {
	words := make([]uint64, (len(b)+7)/8)
	c := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(b))
	copy(c, b)
	return c
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

// reduceHalf reduces 16-bit floats in float32 and rounds each result back.
func reduceHalf(red Reduction, dst, src []uint16, up func(uint16) float32, down func(float32) uint16) {
	src = src[:len(dst)]
	for i, s := range src {
		dst[i] = down(combine(red, up(dst[i]), up(s)))
	}
}

// combine returns a ∘ b, with NaN winning Min and Max like minInto.
func combine(red Reduction, a, b float32) float32 {
	switch red {
	case Min:
		if b < a || b != b {
			return b
		}
		return a
	case Max:
		if b > a || b != b {
			return b
		}
		return a
	}
	return a + b
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
	case Float16:
		divideHalf(view[uint16](buf), float32(n), f16ToF32, f32ToF16)
	case BFloat16:
		divideHalf(view[uint16](buf), float32(n), bf16ToF32, f32ToBF16)
	}
}

func divide[T number](buf []T, n T) {
	for i := range buf {
		buf[i] /= n
	}
}

func divideHalf(buf []uint16, n float32, up func(uint16) float32, down func(float32) uint16) {
	for i, v := range buf {
		buf[i] = down(up(v) / n)
	}
}
