package collective

import (
	"runtime"
	"sync/atomic"
)

// ringRecv is the receive side of a ring all-reduce, which the reader of
// the connection from the previous member runs, under g.mu, as the frames
// arrive: it checks each against the ring's schedule in arrival order
// and, over a connection that shows frames in place (shared memory), has
// the reader reduce or copy the payload from where it lies straight into
// dst (compressed, into the buffer the member sends on), saving a copy
// into a buffer.
//
// An all-gather frame overwrites a region of dst (or, when dst is src,
// of src) that this member has sent from before: the frame's own value
// comes after that send around the ring, yet the reader waits until the
// call has counted the send as returned (sent), so that the region is not
// written while a send may read it, whatever the peers do.
type ringRecv struct {
	o        *op
	r        ring
	from     int // the previous member, the only one that sends to this call
	dst, src []byte
	arrived  []int          // by chunk, the step of its next frame
	sent     []atomic.Int32 // by chunk, this member's sends of it that returned
	ending   atomic.Bool    // the call is ending: apply nothing more
	applying int            // in-place applications in progress
	remote   bool           // this member can read the memory of `from`
	remoteIn bool           // a remote chunk arrived (under g.mu)
	offs     []int          // by rank, where each peer's result lies in its arena when the call pushes (push.go)
	fuse     bool           // the call pushes a float32 sum: its last reduce-scatter step sums into dst and a peer at once
}

// receiveRing attaches the receive side of a ring all-reduce to the call
// and checks the frames that arrived before it.
func (o *op) receiveRing(r ring, dst, src []byte, offs []int) *ringRecv {
	g := o.g
	rr := &ringRecv{o: o, r: r, from: mod(g.rank-1, r.n), dst: dst, src: src, offs: offs,
		fuse:    offs != nil && o.self.red == Sum && addsInOnePass(Sum, o.self.dtype, dst, src, dst),
		arrived: make([]int, r.chunks), sent: make([]atomic.Int32, r.chunks)}
	rr.remote = o.readable(rr.from)
	g.mu.Lock()
	defer g.mu.Unlock()
	o.box.ring = rr
	q := o.box.queues[rr.from]
	for i := range q {
		_, q[i].err = rr.admit(&q[i].h)
		q[i].admitted = true
	}
	return rr
}

// admit checks a frame that has just arrived: a frame the call's header
// disagrees with is left to recv to report; one out of the schedule gets
// a protocol error. It returns whether the frame may be applied in place.
// Caller holds g.mu.
func (rr *ringRecv) admit(h *header) (bool, error) {
	o := rr.o
	if o.check(rr.from, h) != nil {
		return false, nil
	}
	k, c := int(h.step), int(h.chunk)
	remote := h.flags&flagRemote != 0
	if remote && h.step == stepReadsDone && c == 0 && h.length == 0 {
		return false, nil // the next member has read this one's chunks (n = 2: it is also the previous)
	}
	pushed := h.flags&flagPushed != 0
	if c >= rr.r.chunks || k >= rr.steps() || rr.arrived[c] != k || pushed != (rr.offs != nil) || h.flags == flagArena {
		return false, o.protocolErr(rr.from, "unexpected step %d chunk %d", k, c)
	}
	lo, hi := rr.elems(k, c)
	length := (hi - lo) * o.wireSize()
	if pushed {
		length = 0
	}
	if remote {
		if !rr.remote || o.self.wire != 0 {
			return false, o.unreadable(rr.from)
		}
		rr.remoteIn, length = true, remoteRefLen
	}
	if w := o.wireSize(); h.offset != uint64(lo*w) || int(h.length) != length {
		return false, o.protocolErr(rr.from, "chunk at %d+%d, want %d+%d", h.offset, h.length, lo*w, length)
	}
	rr.arrived[c]++
	if pushed {
		return k < rr.r.n-1 && !(rr.fuse && k == rr.r.n-2), nil
	}
	return rr.inPlace(k), nil
}

// steps returns the steps of the ring whose frames come from the previous
// member: the reduce-scatter's and the all-gather's, or, when the call
// pushes, the reduce-scatter's and the notices of the all-gather's first.
func (rr *ringRecv) steps() int {
	if rr.offs != nil {
		return rr.r.n
	}
	return 2 * (rr.r.n - 1)
}

// inPlace reports whether frames of step k may be applied where they lie:
// all of them, but for a compressed call's all-gather steps that forward
// the 16 bits they received, which a buffer keeps for the send.
func (rr *ringRecv) inPlace(k int) bool {
	n := rr.r.n
	return rr.o.self.wire == 0 || k < n-1 || k == 2*(n-1)-1
}

// elems returns the element range that chunk c of step k covers.
func (rr *ringRecv) elems(k, c int) (lo, hi int) {
	return rr.r.chunk(mod(rr.o.g.rank-k-1, rr.r.n), c)
}

// chunk returns the bytes of dst and src that an admitted frame covers.
func (rr *ringRecv) chunk(h *header) (dst, src []byte) {
	lo, hi := rr.elems(int(h.step), int(h.chunk))
	size := rr.o.self.dtype.Size()
	return rr.dst[lo*size : hi*size], rr.src[lo*size : hi*size]
}

// apply reduces or copies an admitted frame's payload into dst, once the
// sends from the region it writes have returned; a compressed
// reduce-scatter step leaves what the member sends on in f.buf. It
// returns false, having applied nothing, if the call ends first.
func (rr *ringRecv) apply(f *frame, payload []byte) bool {
	h := &f.h
	// Step k writes the region that step k-n reduced and step k-n+1 sent
	// on; step n-1, this member's own segment, which step 0 sent from src.
	need := int32(int(h.step) - rr.r.n + 2)
	for rr.sent[h.chunk].Load() < need {
		if rr.ending.Load() {
			return false
		}
		runtime.Gosched()
	}
	dst, src := rr.chunk(h)
	if h.flags&flagPushed != 0 { // a reduce-scatter step: the previous member wrote its part into dst
		rr.o.ringApply(int(h.step), dst, src, dst)
		return true
	}
	if h.flags&flagRemote != 0 {
		f.err = rr.fetch(h, dst, src, payload)
		return true
	}
	if rr.o.self.wire != 0 {
		rr.o.ringApplyWireFrom(f, int(h.step), dst, src, payload)
		return true
	}
	rr.o.ringApply(int(h.step), dst, src, payload)
	return true
}

// sentChunk records that a send of chunk c returned, whether or not it
// succeeded: a frame that needs it to have been received cannot come
// otherwise.
func (rr *ringRecv) sentChunk(c int) { rr.sent[c].Add(1) }

// detach stops the reader from applying frames to the call and waits for
// the applications in progress, so that dst is the caller's again. Caller
// holds g.mu.
func (rr *ringRecv) detach() {
	g := rr.o.g
	rr.o.box.ring = nil
	rr.ending.Store(true)
	for rr.applying > 0 {
		g.applied.Wait()
	}
}
