package collective

import (
	"context"
	"fmt"
	"runtime"
	"unsafe"
)

// AllReduce reduces data (a whole number of dt elements, possibly none) in
// place across the group: afterwards every member holds the same result,
// bit for bit. Calls are matched across members by name and, for repeated
// names, by call order. Small buffers are exchanged directly and reduced in
// rank order; large ones go around a pipelined ring.
func (g *Group) AllReduce(ctx context.Context, name string, red Reduction, dt DType, data []byte, opts ...CallOption) error {
	return g.AllReduceTo(ctx, name, red, dt, data, data, opts...)
}

// AllReduceTo is AllReduce from src into dst, which have the same length
// and are either the same buffer or disjoint; src is left as it was. It
// saves the copy of src into dst that AllReduce on dst would need: the
// ring reads each segment of src once.
func (g *Group) AllReduceTo(ctx context.Context, name string, red Reduction, dt DType, dst, src []byte, opts ...CallOption) error {
	if err := checkArgs(opAllReduce, name, dt, src); err != nil {
		return err
	}
	if red < Sum || red > Max {
		return fmt.Errorf("collective: all-reduce %q: unknown %v", name, red)
	}
	if len(dst) != len(src) {
		return fmt.Errorf("collective: all-reduce %q: %d bytes into %d", name, len(src), len(dst))
	}
	h, err := withOptions(header{op: opAllReduce, dtype: dt, red: red, count: uint64(len(src) / dt.Size())}, opts)
	if err != nil {
		return fmt.Errorf("collective: all-reduce %q: %w", name, err)
	}
	if len(g.members) == 1 {
		copyIfDistinct(dst, src)
		return g.Err()
	}
	if h.wire != 0 && !(aligned(dst, 4) && aligned(src, 4)) {
		return g.allReduceAligned(ctx, name, red, dst, src, opts)
	}
	if h.wire == Int8 {
		return g.allReduceInt8(ctx, name, red, dst, src, opts)
	}
	o, err := g.start(ctx, name, h)
	if err != nil {
		return err
	}
	if h.order == orderTree && len(src) <= g.cfg.directMax {
		return o.end(o.treeReduce(dst, src))
	}
	if h.order == orderTree {
		return o.end(o.treeSegments(dst, src))
	}
	if len(src) <= g.cfg.directMax {
		copyIfDistinct(dst, src)
		return o.end(o.directReduce(dst))
	}
	return o.end(o.ringReduce(dst, src))
}

// allReduceAligned runs a compressed all-reduce of unaligned buffers through
// an aligned copy.
func (g *Group) allReduceAligned(ctx context.Context, name string, red Reduction, dst, src []byte, opts []CallOption) error {
	c := alignedCopy(src)
	if err := g.AllReduce(ctx, name, red, Float32, c, opts...); err != nil {
		return err
	}
	copy(dst, c)
	return nil
}

// copyIfDistinct copies src into dst unless they are the same buffer.
func copyIfDistinct(dst, src []byte) {
	if len(dst) > 0 && unsafe.SliceData(dst) != unsafe.SliceData(src) {
		copy(dst, src)
	}
}

// checkArgs validates what a call can get wrong by itself, before anything
// is sent.
func checkArgs(kind opKind, name string, dt DType, data []byte) error {
	switch {
	case len(name) > maxNameLen:
		return fmt.Errorf("collective: %v: name of %d bytes (at most %d)", kind, len(name), maxNameLen)
	case len(name) > 0 && name[0] == 0:
		return fmt.Errorf("collective: %v %q: names starting with NUL are reserved", kind, name)
	case dt.Size() == 0:
		return fmt.Errorf("collective: %v %q: unknown %v", kind, name, dt)
	case len(data)%dt.Size() != 0:
		return fmt.Errorf("collective: %v %q: %d bytes is not a whole number of %v", kind, name, len(data), dt)
	}
	return nil
}

// directReduce sends data to every peer, receives every peer's buffer and
// reduces all of them in rank order, so every member computes the same
// bits. Compressed, data is first rounded to what the peers will receive.
func (o *op) directReduce(data []byte) error {
	g := o.g
	out := data
	if o.self.wire != 0 {
		b := getBuf(len(data) / 2)
		defer putBuf(b)
		out = *b
		encodeHalf(o.self.wire, view[uint16](out), view[float32](data))
		decodeHalf(o.self.wire, view[float32](data), view[uint16](out))
	}
	for _, p := range g.peers {
		if err := o.send(p, 0, 0, 0, out); err != nil {
			return err
		}
	}
	frames := make([]frame, len(g.members))
	defer func() {
		for i := range frames {
			frames[i].release()
		}
	}()
	for i, p := range g.peers {
		f, err := o.recv(p, g.peers[i+1:])
		frames[p] = f
		if err != nil {
			return err
		}
		if int(f.h.length) != len(out) {
			return o.protocolErr(p, "%d bytes, want %d", f.h.length, len(out))
		}
		if o.self.wire != 0 {
			o.widen(&frames[p])
		}
	}
	o.combineInRankOrder(data, frames)
	return nil
}

// treeReduce sends src to every peer, chunk by chunk, receives every
// peer's buffer and combines them all in tree order (InTreeOrder) into
// dst.
func (o *op) treeReduce(dst, src []byte) error {
	g := o.g
	o.algorithm = "tree"
	if err := o.sendChunks(g.peers, src); err != nil {
		return err
	}
	bufs := make([][]byte, len(g.members))
	bufs[g.rank] = src
	for i, p := range g.peers {
		if err := o.recvChunks(p, g.peers[i+1:], &bufs[p]); err != nil {
			return err
		}
	}
	if err := o.endReads(); err != nil { // peers no longer read src, which dst may be
		return err
	}
	acc := getBuf(len(dst))
	defer putBuf(acc)
	combineTree(o.self.red, o.self.dtype, *acc, bufs)
	if o.self.red == Mean {
		scale(o.self.dtype, *acc, len(bufs))
	}
	copy(dst, *acc)
	return nil
}

// treeSegments is treeReduce for large buffers, moving the ring's bytes:
// each member owns a segment, receives every peer's part of it, combines
// them in tree order and sends the result to every peer. A member
// overwrites a peer's segment of dst (which may be src) only once that
// peer's result arrives, after the peer has read its part of src.
func (o *op) treeSegments(dst, src []byte) error {
	g, n, size := o.g, len(o.g.members), o.self.dtype.Size()
	o.algorithm = "tree, by segment"
	elems := len(src) / size
	seg := func(j int) (int, int) { return j * elems / n * size, (j + 1) * elems / n * size }
	parts, err := o.exchangeBlocks(src, seg)
	if err != nil {
		return err
	}
	lo, hi := seg(g.rank)
	mine := make([]byte, hi-lo) // peers may read it until endReads: never pooled, kept alive
	combineTree(o.self.red, o.self.dtype, mine, parts)
	if o.self.red == Mean {
		scale(o.self.dtype, mine, n)
	}
	for _, p := range g.peers {
		if err := o.sendRange(p, 1, lo, mine); err != nil {
			return err
		}
	}
	copy(dst[lo:hi], mine)
	for i, p := range g.peers {
		plo, phi := seg(p)
		if err := o.recvRange(p, g.peers[i+1:], 1, plo, dst[plo:phi]); err != nil {
			return err
		}
	}
	err = o.endReads()
	// Peers read mine by its address, which the garbage collector does not
	// see: without this, it could free mine once copied, and a peer read
	// another allocation's bytes (zeros, seen once in a test).
	runtime.KeepAlive(mine)
	return err
}

// exchangeBlocks sends each peer its block of src (sendBlocks) and
// returns every member's block of this member's, by rank: its own in src,
// the peers' received.
func (o *op) exchangeBlocks(src []byte, block func(member int) (lo, hi int)) ([][]byte, error) {
	g := o.g
	if err := o.sendBlocks(src, block); err != nil {
		return nil, err
	}
	lo, hi := block(g.rank)
	parts := make([][]byte, len(g.members))
	parts[g.rank] = src[lo:hi]
	for i, p := range g.peers {
		parts[p] = make([]byte, hi-lo)
		if err := o.recvRange(p, g.peers[i+1:], 0, lo, parts[p]); err != nil {
			return nil, err
		}
	}
	return parts, nil
}

// sendRange sends data, which lies at byte offset base of the call's
// buffer, to peer as the chunks of step.
func (o *op) sendRange(peer, step, base int, data []byte) error {
	ch := o.chunking(len(data))
	for i := range ch.count() {
		lo, hi := ch.bounds(i)
		if err := o.sendChunk(peer, step, i, base+lo, data[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// recvRange receives into dst the chunks of step that peer sent with
// sendRange from byte offset base.
func (o *op) recvRange(peer int, later []int, step, base int, dst []byte) error {
	ch := o.chunking(len(dst))
	for i := range ch.count() {
		f, err := o.recv(peer, later)
		if err != nil {
			return err
		}
		lo, hi := ch.bounds(i)
		err = o.takeChunkFrame(peer, &f, step, i, base+lo, dst[lo:hi])
		f.release()
		if err != nil {
			return err
		}
	}
	return nil
}

// combineTree computes into out the combination of bufs along the tree
// of InTreeOrder.
func combineTree(red Reduction, dt DType, out []byte, bufs [][]byte) {
	if len(bufs) == 1 {
		copy(out, bufs[0])
		return
	}
	mid := len(bufs) / 2
	combineTree(red, dt, out, bufs[:mid])
	right := getBuf(len(out))
	defer putBuf(right)
	combineTree(red, dt, *right, bufs[mid:])
	reduceInto(red, dt, out, *right)
}

// widen replaces a compressed frame's payload with its float32 values.
func (o *op) widen(f *frame) {
	b := getBuf(2 * len(f.payload()))
	decodeHalf(o.self.wire, view[float32](*b), view[uint16](f.payload()))
	f.release()
	f.buf = b
}

// combineInRankOrder computes ((x0 ∘ x1) ∘ x2)… into data, where x_rank is
// data itself and the others are frames' payloads.
func (o *op) combineInRankOrder(data []byte, frames []frame) {
	g, red, dt := o.g, o.self.red, o.self.dtype
	acc := data
	if g.rank != 0 {
		acc = frames[0].payload()
	}
	for r := 1; r < len(g.members); r++ {
		src := data
		if r != g.rank {
			src = frames[r].payload()
		}
		reduceInto(red, dt, acc, src)
	}
	if red == Mean {
		scale(dt, acc, len(g.members))
	}
	if g.rank != 0 {
		copy(data, acc)
	}
}
