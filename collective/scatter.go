package collective

import (
	"context"
	"fmt"
)

// ScatterBlock returns the first element and the length of the block of a
// buffer of elems elements that member rank of n holds after
// ReduceScatter: the buffer cut into n blocks in rank order, whose lengths
// differ by at most one element (the first elems mod n one longer), as
// the ring all-reduce cuts its segments. An AllGather of every member's
// block, in rank order, is the whole buffer.
func ScatterBlock(elems, n, rank int) (start, length int) {
	return newRing(elems, n, 1).segment(rank)
}

// ReduceScatter reduces src (a whole number of dt elements, as long on
// every member) across the group as AllReduceTo does, and writes into dst,
// which is no part of src, this member's block of the result
// (ScatterBlock), with the very bits AllReduceTo gives those elements.
// Each member sends every other its block of src and combines the blocks
// it receives, so it sends (n-1)/n of the buffer, as a ring's
// reduce-scatter does, in one round trip. It takes no compression and no
// InTreeOrder.
func (g *Group) ReduceScatter(ctx context.Context, name string, red Reduction, dt DType, dst, src []byte, opts ...CallOption) error {
	if err := checkArgs(opReduceScatter, name, dt, src); err != nil {
		return err
	}
	if red < Sum || red > Max {
		return fmt.Errorf("collective: reduce-scatter %q: unknown %v", name, red)
	}
	size := dt.Size()
	_, n := ScatterBlock(len(src)/size, len(g.members), g.rank)
	if len(dst) != n*size {
		return fmt.Errorf("collective: reduce-scatter %q: member %d's block of %d bytes of %d into %d bytes", name, g.rank, n*size, len(src), len(dst))
	}
	h, err := withOptions(header{op: opReduceScatter, dtype: dt, red: red, count: uint64(len(src) / size)}, opts)
	if err != nil {
		return fmt.Errorf("collective: reduce-scatter %q: %w", name, err)
	}
	if len(g.members) == 1 {
		copy(dst, src)
		return g.Err()
	}
	o, err := g.start(ctx, name, h)
	if err != nil {
		return err
	}
	return o.end(o.scatterBlocks(dst, src))
}

// scatterBlocks sends each peer its block of src, receives every peer's
// part of this member's block and combines them into dst in the order
// AllReduceTo's path for a buffer of this size does: from rank 0 up
// (direct) or, as the ring's segment travels, from this member up and
// round (the ring starts each segment at the member of its index).
func (o *op) scatterBlocks(dst, src []byte) error {
	g, n, size := o.g, len(o.g.members), o.self.dtype.Size()
	block := func(p int) (lo, hi int) {
		s, l := ScatterBlock(len(src)/size, n, p)
		return s * size, (s + l) * size
	}
	parts, err := o.exchangeBlocks(src, block)
	if err != nil {
		return err
	}
	first := 0
	if o.algorithm = "direct"; len(src) > g.cfg.directMax {
		first, o.algorithm = g.rank, "ring order"
	}
	copy(dst, parts[first])
	for i := 1; i < n; i++ {
		reduceInto(o.self.red, o.self.dtype, dst, parts[(first+i)%n])
	}
	if o.self.red == Mean {
		scale(o.self.dtype, dst, n)
	}
	return o.endReads() // peers no longer read src
}
