package collective

import (
	"context"
	"fmt"
	"math"
)

// int8Block is how many elements share a scale under Compress(Int8).
const int8Block = 256

// roundMagic is 1.5·2²³: see quantize.
const roundMagic float32 = 1 << 23 * 1.5

// int8Levels is the largest magnitude each of n members rounds its
// elements to when their int8 levels are summed: the sum of n of them
// fits an int8.
func int8Levels(n int) int { return 127 / n }

// allReduceInt8 is AllReduceTo of float32 src into dst, summed or averaged
// (red), compressed to int8 (Compress): up to the direct path's size by
// gatherInt8, larger around the ring by sumInt8. opts are the call's.
func (g *Group) allReduceInt8(ctx context.Context, name string, red Reduction, dst, src []byte, opts []CallOption) error {
	x := view[float32](src)
	maxima, q := int8Buffers(x)
	if g.int8Direct(len(x)) {
		return g.gatherInt8(ctx, name, red, view[float32](dst), x, maxima, q)
	}
	return g.sumInt8(ctx, name, red, view[float32](dst), x, maxima, q, opts)
}

// int8Direct reports whether an int8 all-reduce of elems elements takes
// the direct path (gatherInt8) rather than the ring (sumInt8).
func (g *Group) int8Direct(elems int) bool { return elems <= g.cfg.directMax }

// int8Buffers returns the maxima of x's blocks (blockMaxima) and room for
// x's levels.
func int8Buffers(x []float32) ([]float32, []int8) {
	maxima := make([]float32, (len(x)+int8Block-1)/int8Block)
	blockMaxima(maxima, x)
	return maxima, make([]int8, len(x)) // larger than a pooled payload, for a buffer of more than 4 MiB
}

// gatherInt8 sends every member this member's blocks of x rounded to ±127
// levels of their own maxima, with the maxima, in one all-gather, and
// adds all members' in rank order: one round trip, and each member's
// values to 127 levels.
func (g *Group) gatherInt8(ctx context.Context, name string, red Reduction, dst, x, maxima []float32, q []int8) error {
	quantize(q, x, maxima, 127)
	parts, err := g.AllGather(ctx, name, Int8, append(bytesOf(maxima), bytesOf(q)...))
	if err != nil {
		return fmt.Errorf("collective: all-reduce %q compressed to int8 gathers every member's levels: %w", name, err)
	}
	for p, part := range parts {
		if len(part) != 4*len(maxima)+len(q) {
			return fmt.Errorf("collective: all-reduce %q compressed to int8: %s sent %d bytes of levels and maxima, expected %d", name, g.members[p], len(part), 4*len(maxima)+len(q))
		}
		theirs := view[float32](alignedCopy(part[:4*len(maxima)]))
		dequantize(dst, view[int8](part[4*len(maxima):]), theirs, 127, 0, p > 0)
	}
	if red == Mean {
		divide(dst, float32(len(g.members)))
	}
	return nil
}

// sumInt8 agrees with the other members on each block's largest
// magnitude in one all-reduce, and sums the members' blocks rounded to
// int8Levels levels of it in a second, exactly; opts's Shape goes with
// the sum.
func (g *Group) sumInt8(ctx context.Context, name string, red Reduction, dst, x, maxima []float32, q []int8, opts []CallOption) error {
	levels, err := g.agreeInt8(ctx, opAllReduce, name, red, x, maxima, q)
	if err != nil {
		return err
	}
	if err := g.AllReduce(ctx, name, Sum, Int8, bytesOf(q), append(opts[:len(opts):len(opts)], Compress(0))...); err != nil {
		return err
	}
	dequantize(dst, q, maxima, levels, 0, false)
	return nil
}

// agreeInt8 is sumInt8's first half: the maxima agreed on, x's levels of
// them in q. It returns the levels the sum of q is in units of.
func (g *Group) agreeInt8(ctx context.Context, kind opKind, name string, red Reduction, x, maxima []float32, q []int8) (float32, error) {
	n := len(g.members)
	if int8Levels(n) == 0 {
		return 0, fmt.Errorf("collective: %v %q: cannot compress %d elements to int8 in a group of %d members: each would have no level (at most 127 members, or at most %d elements)", kind, name, len(x), n, g.cfg.directMax)
	}
	if err := g.AllReduce(ctx, name, Max, Float32, bytesOf(maxima)); err != nil {
		return 0, fmt.Errorf("collective: %v %q compressed to int8 agrees first on the maxima of its %d blocks: %w", kind, name, len(maxima), err)
	}
	levels := float32(int8Levels(n))
	quantize(q, x, maxima, levels)
	if red == Mean {
		levels *= float32(n)
	}
	return levels, nil
}

// reduceScatterInt8 is ReduceScatter of float32 src into dst, this
// member's block (lo is its first element), summed or averaged (red),
// compressed to int8 as AllReduceTo compresses it, with its bits: up to
// the direct path's size, that all-reduce itself; larger, sumInt8's
// int8 sum reduce-scattered, a quarter of the bytes. opts are the call's.
func (g *Group) reduceScatterInt8(ctx context.Context, name string, red Reduction, dst, src []byte, lo int, opts []CallOption) error {
	x := view[float32](src)
	if g.int8Direct(len(x)) {
		whole := make([]byte, len(src))
		if err := g.allReduceInt8(ctx, name, red, whole, src, opts); err != nil {
			return err
		}
		copy(dst, whole[4*lo:])
		return nil
	}
	maxima, q := int8Buffers(x)
	levels, err := g.agreeInt8(ctx, opReduceScatter, name, red, x, maxima, q)
	if err != nil {
		return err
	}
	sum := make([]int8, len(dst)/4)
	if err := g.ReduceScatter(ctx, name, Sum, Int8, bytesOf(sum), bytesOf(q), append(opts[:len(opts):len(opts)], Compress(0))...); err != nil {
		return err
	}
	dequantize(view[float32](dst), sum, maxima, levels, lo, false)
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

// dequantize sets dst, or with add adds to it, the levels q in units of
// their block's maximum over levels; a block whose maximum is not finite
// is NaN. dst and q are the elements of a buffer from start on, whose
// blocks' maxima are maxima.
func dequantize(dst []float32, q []int8, maxima []float32, levels float32, start int, add bool) {
	for b := start / int8Block; b*int8Block < start+len(dst); b++ {
		m := maxima[b]
		lo, hi := max(b*int8Block, start)-start, min(start+len(dst), (b+1)*int8Block)-start
		s := m / levels
		if !(m <= math.MaxFloat32) {
			s = float32(math.NaN())
		}
		if add {
			for i, v := range q[lo:hi] {
				dst[lo+i] += float32(float32(v) * s) // not fused: the same bits on every processor
			}
			continue
		}
		for i, v := range q[lo:hi] {
			dst[lo+i] = float32(v) * s
		}
	}
}
