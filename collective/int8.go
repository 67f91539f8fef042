package collective

import (
	"context"
	"fmt"
	"math"
	"unsafe"
)

// int8Block is how many elements share a scale under Compress(Int8).
const int8Block = 256

// roundMagic is 1.5·2²³: see quantize.
const roundMagic float32 = 1 << 23 * 1.5

// int8Levels is the largest magnitude each of n members rounds its
// elements to under Compress(Int8): the sum of n of them fits an int8.
func int8Levels(n int) int { return 127 / n }

// allReduceInt8 is AllReduceTo of float32 src into dst, summed or averaged
// (red), compressed to int8 (Compress): one all-reduce agrees on each
// block's largest magnitude, a second sums the members' blocks rounded to
// int8Levels levels of it, exactly. opts are the call's, whose Shape the
// int8 sum keeps.
func (g *Group) allReduceInt8(ctx context.Context, name string, red Reduction, dst, src []byte, opts []CallOption) error {
	n := len(g.members)
	if int8Levels(n) == 0 {
		return fmt.Errorf("collective: all-reduce %q: cannot compress to int8 in a group of %d members: each would have no level (at most 127 members)", name, n)
	}
	x := view[float32](src)
	maxima := make([]float32, (len(x)+int8Block-1)/int8Block)
	blockMaxima(maxima, x)
	if err := g.AllReduce(ctx, name, Max, Float32, bytesOf(maxima)); err != nil {
		return fmt.Errorf("collective: all-reduce %q compressed to int8 agrees first on the maxima of its %d blocks: %w", name, len(maxima), err)
	}
	q := make([]int8, len(x)) // larger than a pooled payload, for a buffer of more than 4 MiB
	levels := float32(int8Levels(n))
	quantize(q, x, maxima, levels)
	if err := g.AllReduce(ctx, name, Sum, Int8, int8Bytes(q), append(opts[:len(opts):len(opts)], Compress(0))...); err != nil {
		return err
	}
	if red == Mean {
		levels *= float32(n)
	}
	dequantize(view[float32](dst), q, maxima, levels)
	return nil
}

// blockMaxima sets maxima[b] to the largest magnitude of x's block b, or
// a NaN of it: as bits with the sign cleared, the magnitudes order as
// their floats do, and a NaN's lie above every number's.
func blockMaxima(maxima, x []float32) {
	bits := bits32(x)
	for b := range maxima {
		var m uint32
		for _, u := range bits[b*int8Block : min(len(x), (b+1)*int8Block)] {
			m = max(m, u&^(1<<31))
		}
		maxima[b] = math.Float32frombits(m)
	}
}

// quantize rounds each element of x to the nearest multiple (ties to
// even) of its block's maximum over levels, in units of it: at most
// levels in magnitude, since no element exceeds its block's maximum. A
// block whose maximum is 0 or not finite is all zeros.
func quantize(q []int8, x, maxima []float32, levels float32) {
	for b, m := range maxima {
		lo, hi := b*int8Block, min(len(x), (b+1)*int8Block)
		if !(m > 0 && m <= math.MaxFloat32) {
			clear(q[lo:hi])
			continue
		}
		s := levels / m
		for i, v := range x[lo:hi] {
			// Adding and taking away 1.5·2²³ rounds a float32 of magnitude
			// under 2²² to an integer, to nearest, ties to even; the
			// conversion keeps the product from fusing with the sum.
			q[lo+i] = int8(float32(v*s) + roundMagic - roundMagic)
		}
	}
}

// dequantize sets dst to the sums q in units of their block's maximum
// over levels; a block whose maximum is not finite is NaN.
func dequantize(dst []float32, q []int8, maxima []float32, levels float32) {
	for b, m := range maxima {
		lo, hi := b*int8Block, min(len(dst), (b+1)*int8Block)
		s := m / levels
		if !(m <= math.MaxFloat32) {
			s = float32(math.NaN())
		}
		for i, v := range q[lo:hi] {
			dst[lo+i] = float32(v) * s
		}
	}
}

// int8Bytes returns the bytes of q, sharing its memory.
func int8Bytes(q []int8) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(q))), len(q))
}
