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

// blockBytes returns the byte range of member p's block (ScatterBlock) of
// a buffer of total bytes of elements of size bytes, in a group of n.
func blockBytes(total, size, n, p int) (lo, hi int) {
	s, l := ScatterBlock(total/size, n, p)
	return s * size, (s + l) * size
}

// ReduceScatter reduces src (a whole number of dt elements, as long on
// every member) across the group as AllReduceTo does, and writes into dst,
// which is no part of src, this member's block of the result
// (ScatterBlock), with the very bits AllReduceTo gives those elements.
// Each member sends every other its block of src and combines the blocks
// it receives, so it sends (n-1)/n of the buffer, as a ring's
// reduce-scatter does, in one round trip. It takes no InTreeOrder, and
// of compressions only Compress(Int8), of a float32 sum or mean, which
// gives the block the bits of AllReduceTo compressed alike.
func (g *Group) ReduceScatter(ctx context.Context, name string, red Reduction, dt DType, dst, src []byte, opts ...CallOption) error {
	if err := checkArgs(opReduceScatter, name, dt, src); err != nil {
		return err
	}
	if red < Sum || red > Max {
		return fmt.Errorf("collective: reduce-scatter %q: unknown %v", name, red)
	}
	lo, hi := blockBytes(len(src), dt.Size(), len(g.members), g.rank)
	if len(dst) != hi-lo {
		return fmt.Errorf("collective: reduce-scatter %q: member %d's block of %d bytes of %d into %d bytes", name, g.rank, hi-lo, len(src), len(dst))
	}
	h, err := withOptions(header{op: opReduceScatter, dtype: dt, red: red, count: uint64(len(src) / dt.Size())}, opts)
	if err != nil {
		return fmt.Errorf("collective: reduce-scatter %q: %w", name, err)
	}
	if len(g.members) == 1 {
		copy(dst, src)
		return g.Err()
	}
	if h.wire == Int8 {
		if !aligned(dst, 4) || !aligned(src, 4) {
			return fmt.Errorf("collective: reduce-scatter %q compressed to int8: buffers not aligned for float32", name)
		}
		return g.reduceScatterInt8(ctx, name, red, dst, src, lo/4, opts)
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
// round (the ring starts each segment at the member of its index). The
// blocks go chunk by chunk to every peer in turn, and each chunk of dst
// is combined as its parts arrive.
func (o *op) scatterBlocks(dst, src []byte) error {
	g, n := o.g, len(o.g.members)
	block := func(p int) (lo, hi int) { return blockBytes(len(src), o.self.dtype.Size(), n, p) }
	if err := o.sendBlocks(src, block); err != nil {
		return err
	}
	first := 0
	if o.algorithm = "direct"; len(src) > g.cfg.directMax {
		first, o.algorithm = g.rank, "ring order"
	}
	order := make([]int, n)
	for i := range order {
		order[i] = (first + i) % n
	}
	lo, hi := block(g.rank)
	ch := o.chunking(hi - lo)
	part := getBuf(ch.per)
	defer putBuf(part)
	for i := range ch.count() {
		clo, chi := ch.bounds(i)
		if err := o.combineChunk(dst[clo:chi], src[lo+clo:lo+chi], (*part)[:chi-clo], order, i, lo+clo); err != nil {
			return err
		}
	}
	if o.self.red == Mean {
		scale(o.self.dtype, dst, n)
	}
	return o.endReads() // peers no longer read src
}

// sendBlocks sends each peer its block of src, bytes [lo, hi) of
// block(peer), as step 0: chunk i to every peer, from the next member
// round, before chunk i+1.
func (o *op) sendBlocks(src []byte, block func(member int) (lo, hi int)) error {
	g, n := o.g, len(o.g.members)
	for i, more := 0, true; more; i++ {
		more = false
		for k := 1; k < n; k++ {
			p := (g.rank + k) % n
			lo, hi := block(p)
			ch := o.chunking(hi - lo)
			if i >= ch.count() {
				continue
			}
			a, b := ch.bounds(i)
			if err := o.sendChunk(p, 0, i, lo+a, src[lo+a:lo+b]); err != nil {
				return err
			}
			more = true
		}
	}
	return nil
}

// combineChunk combines into out, in order, chunk i, at byte offset off,
// of every member's part of this member's block: own for this member's,
// the peers' received into part. The first part received lands in out
// itself, and own, when first, joins the next part in one pass: the same
// operations in the same order as copying the first and combining the
// rest, one pass over the chunk fewer.
func (o *op) combineChunk(out, own, part []byte, order []int, i, off int) error {
	red, dt := o.self.red, o.self.dtype
	ownFirst := order[0] == o.g.rank
	for k, m := range order {
		if m == o.g.rank {
			if k > 0 {
				reduceInto(red, dt, out, own)
			}
			continue
		}
		dst := part
		if k == 0 {
			dst = out
		}
		if err := o.takePart(m, order[k+1:], i, off, dst); err != nil {
			return err
		}
		switch {
		case k == 0:
		case k == 1 && ownFirst:
			reduceTo(red, dt, out, own, part)
		default:
			reduceInto(red, dt, out, part)
		}
	}
	return nil
}

// takePart receives peer's chunk i, at byte offset off, of this member's
// block into dst; later are the members whose parts come after.
func (o *op) takePart(peer int, later []int, i, off int, dst []byte) error {
	f, err := o.recv(peer, later)
	if err != nil {
		return err
	}
	defer f.release()
	return o.takeChunkFrame(peer, &f, 0, i, off, dst)
}

// AllGatherBlocks writes every member's block into its place in dst, the
// inverse of ReduceScatter: block is this member's, of ScatterBlock's
// length for a buffer of len(dst) bytes, and member p's lands at
// ScatterBlock(len(dst)/dt.Size(), n, p) of dst. After a ReduceScatter
// into block, dst holds the all-reduce's result. It sends the frames of an
// AllGather, into the caller's buffer.
func (g *Group) AllGatherBlocks(ctx context.Context, name string, dt DType, dst, block []byte, opts ...CallOption) error {
	if err := checkArgs(opAllGather, name, dt, dst); err != nil {
		return err
	}
	n := len(g.members)
	out := make([][]byte, n) // every member's place in dst
	for p := range out {
		lo, hi := blockBytes(len(dst), dt.Size(), n, p)
		out[p] = dst[lo:hi]
	}
	if len(block) != len(out[g.rank]) {
		return fmt.Errorf("collective: all-gather %q: member %d's block of %d bytes of %d, not %d bytes", name, g.rank, len(out[g.rank]), len(dst), len(block))
	}
	h, err := withOptions(header{op: opAllGather, dtype: dt, count: uint64(len(block) / dt.Size())}, opts)
	if err != nil {
		return fmt.Errorf("collective: all-gather %q: %w", name, err)
	}
	copy(out[g.rank], block)
	if n == 1 {
		return g.Err()
	}
	o, err := g.start(ctx, name, h)
	if err != nil {
		return err
	}
	return o.end(o.gather(block, out))
}
