package collective

import "errors"

// ring partitions a buffer for the ring all-reduce: n segments (one per
// member, sizes differing by at most one element), each cut into the same
// number of chunks.
type ring struct {
	n, chunks int
	elems     int // elements in the buffer
}

// newRing partitions elems elements into chunks of at most chunkElems.
func newRing(elems, n, chunkElems int) ring {
	r := ring{n: n, elems: elems}
	maxSeg := (elems + n - 1) / n
	r.chunks = max(1, (maxSeg+chunkElems-1)/chunkElems)
	return r
}

// segment returns the first element and the length of segment s.
func (r ring) segment(s int) (start, n int) {
	q, rem := r.elems/r.n, r.elems%r.n
	return s*q + min(s, rem), q + btoi(s < rem)
}

// chunk returns the element range of chunk c of segment s.
func (r ring) chunk(s, c int) (lo, hi int) {
	start, n := r.segment(s)
	return start + n*c/r.chunks, start + n*(c+1)/r.chunks
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func mod(a, n int) int { return ((a % n) + n) % n }

// ringReduce runs reduce-scatter then all-gather around the ring rank →
// rank+1. At step k (0 ≤ k < 2(n-1)) a member sends segment rank-k and
// receives segment rank-k-1, reducing it for k < n-1 and copying it after.
// Every chunk is pipelined on its own: receiving chunk c of step k lets the
// member send chunk c of step k+1 at once, and a window of step-0 chunks
// keeps the ring busy (all of them, when they go as addresses). Each
// element is reduced along one fixed path and then copied, so every
// member ends with the same bits. Step 0 sends from
// src; later steps send what the member has just reduced or received, so
// dst needs no copy of src first. Chunks are cut in elements so that a
// frame's payload on the wire, compressed or not, is at most chunkBytes.
// Frames are checked, and over shared memory reduced, as they arrive (see
// ringRecv).
func (o *op) ringReduce(dst, src []byte) error {
	g := o.g
	n, rank := len(g.members), g.rank
	next := mod(rank+1, n)
	offs, err := o.negotiatePush(dst, src)
	if err != nil {
		return err
	}
	if o.algorithm = "ring"; offs != nil {
		o.algorithm = "ring, pushed"
	}
	r := newRing(len(dst)/o.self.dtype.Size(), n, max(1, g.cfg.chunkBytes/o.wireSize()))
	rr := o.receiveRing(r, dst, src, offs)
	sent0, window := 0, g.cfg.ringWindow
	for ; sent0 < min(window, r.chunks); sent0++ {
		if err := o.sendSource(next, rr, src, sent0); err != nil {
			return err
		}
		if rr.offs != nil || o.leases != nil && o.leases[next] != nil {
			window = r.chunks // pushes and addresses take no room in the ring: send them all
		}
	}
	for range rr.steps() * r.chunks {
		k, err := o.ringStep(rr, next)
		if err != nil {
			return err
		}
		if k == 0 && sent0 < r.chunks {
			if err := o.sendSource(next, rr, src, sent0); err != nil {
				return err
			}
			sent0++
		}
	}
	if offs != nil {
		if err := o.awaitPushes(rr); err != nil {
			return err
		}
	}
	g.mu.Lock()
	read := rr.remoteIn
	g.mu.Unlock()
	if read {
		o.markRead(rr.from)
	}
	return o.endReads()
}

// wireSize returns the bytes an element takes on the wire.
func (o *op) wireSize() int {
	if o.self.wire != 0 {
		return o.self.wire.Size()
	}
	return o.self.dtype.Size()
}

// sendSource sends chunk c of step 0 (this member's own segment) from src,
// compressed through a pooled buffer if the call compresses.
func (o *op) sendSource(to int, rr *ringRecv, src []byte, c int) error {
	defer rr.sentChunk(c)
	lo, hi := rr.r.chunk(o.g.rank, c)
	size, w := o.self.dtype.Size(), o.wireSize()
	data := src[lo*size : hi*size]
	if rr.offs != nil {
		return o.pushNext(rr, to, 0, c, lo*size, data)
	}
	if o.self.wire != 0 {
		b := getBuf((hi - lo) * w)
		defer putBuf(b)
		encodeHalf(o.self.wire, view[uint16](*b), view[float32](data))
		data = *b
	}
	return o.sendChunk(to, 0, c, lo*w, data)
}

// ringStep takes the next chunk from the previous member, which arrived
// checked against the schedule, reduces it with src's chunk or copies it
// into dst unless that was done as it arrived, and sends next what
// follows from it (chunk c of step k+1). It returns k.
func (o *op) ringStep(rr *ringRecv, next int) (int, error) {
	f, err := o.recv(rr.from, nil)
	if err != nil {
		return 0, err
	}
	defer f.release()
	k := int(f.h.step)
	if f.h.flags&flagRemote != 0 && !f.applied && f.err == nil {
		out, local := rr.chunk(&f.h)
		f.err, f.applied = rr.fetch(&f.h, out, local, f.payload()), true
	}
	if errors.Is(f.err, errReleased) {
		return 0, o.awaitEnd(rr.from)
	}
	if f.err != nil {
		return 0, f.err
	}
	if rr.offs != nil {
		return k, o.pushStep(rr, &f, next)
	}
	out, local := rr.chunk(&f.h)
	switch {
	case !f.applied:
		out = o.ringApply(k, out, local, f.payload())
	case o.self.wire != 0:
		out = f.payload() // the rounded reduction the reader left to send on
	}
	if k+1 < 2*(rr.r.n-1) {
		defer rr.sentChunk(int(f.h.chunk))
		return k, o.sendChunk(next, k+1, int(f.h.chunk), int(f.h.offset), out)
	}
	return k, nil
}

// ringApply reduces (reduce-scatter: dst = local ∘ recv, where local is
// src's chunk, as each segment is received once then) or copies (all-gather)
// one chunk, and returns what to send on; the member that completes a
// segment's reduction applies Mean's division.
func (o *op) ringApply(k int, dst, local, recv []byte) []byte {
	if o.self.wire != 0 {
		return o.ringApplyWire(k, dst, local, recv)
	}
	n := len(o.g.members)
	if k >= n-1 {
		copy(dst, recv)
		return dst
	}
	reduceTo(o.self.red, o.self.dtype, dst, local, recv)
	if k == n-2 && o.self.red == Mean {
		scale(o.self.dtype, dst, n)
	}
	return dst
}

// ringApplyWire is ringApply for a compressed chunk, which it works on in
// place and sends on. A reduce-scatter step rounds the float32 reduction
// back into the chunk; the member that completes a segment also keeps the
// decoded rounded values, the very values every other member decodes from
// the 16 bits it forwards unchanged in the all-gather.
func (o *op) ringApplyWire(k int, dst, local, recv []byte) []byte {
	o.applyWire(k, dst, local, recv, recv)
	return recv
}

// ringApplyWireFrom is ringApplyWire for a compressed chunk that lies in
// the connection's memory, which it reads there: a reduce-scatter step
// leaves the rounded reduction to send on in a pooled buffer, f.buf; the
// last all-gather step decodes into dst. (The other all-gather steps, which
// forward the bits received, are not applied in place.)
func (o *op) ringApplyWireFrom(f *frame, k int, dst, local, recv []byte) {
	var to []byte
	if k < len(o.g.members)-1 {
		f.buf = getBuf(len(recv))
		to = *f.buf
	}
	o.applyWire(k, dst, local, to, recv)
}

// applyWire decodes an all-gather step's chunk recv into dst, or reduces a
// reduce-scatter step's with local and rounds the result into to (and, on
// the step that completes the segment, into dst as float32).
func (o *op) applyWire(k int, dst, local, to, recv []byte) {
	n, wire := len(o.g.members), o.self.wire
	var out []float32
	switch {
	case k >= n-1:
		decodeHalf(wire, view[float32](dst), view[uint16](recv))
		return
	case k == n-2:
		out = view[float32](dst)
	}
	reduceWire(o.self.red, wire, view[uint16](to), view[uint16](recv), view[float32](local), out, n)
}
