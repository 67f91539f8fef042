package collective

import (
	"fmt"
	"unsafe"

	"github.com/tfdist/tfdist/internal/shmbridge"
)

// Pushed results. Between members on one host whose results lie in
// memory that each maps of the other (every process's arena, see
// arena_linux.go), a ring all-reduce writes instead of sending: each
// chunk of the reduce-scatter goes into the next member's result, followed
// by a notice (a data frame flagged flagPushed, of the chunk's step, with
// no payload), and the next member reduces it there in place with its own
// part; the member that completes a segment's reduction writes each chunk
// of it into every peer's result and sends each a notice of the
// all-gather's first step, in place of the all-gather's n-1 steps. Every
// element is reduced along one fixed path, as without pushes (with the
// two operands swapped, which changes at most which of two NaNs a min or
// max keeps), so every member holds the same bits.
//
// Every member must agree that a call pushes. At the start of a ring
// all-reduce of pushMin bytes or more, a member sends each peer whose link
// maps both arenas an announce (flagArena, step stepAnnounce) whose offset
// is where its result lies in its arena, or noArena when it does not, or
// when one of its links does not map both arenas; the call pushes when
// every announce it receives has an offset and its own has one. (Every
// member must have the same pushMin.) A compressed call that pushes moves
// float32: shared memory has no link for 16 bits to spare, and the
// conversions would cost more than they save, so every member drops the
// wire type once the announces agree, and the results are exact. A link
// that does not map both arenas is known as such to both its ends, which
// then announce noArena to everyone else: so either every member pushes
// or none does.
//
// A peer writes into a member's result only while the member's call
// waits for its notices. A call that fails keeps its result's span of the
// arena out of use for good (the group is broken by then, and a peer may
// still write), so that no later tensor is written over.

// defaultPushMin is the smallest all-reduce that announces. Every member
// must agree on which calls do, so it is not an option (tests change it
// on every member).
const defaultPushMin = 4 << 20

const (
	// flagPushed marks a notice: the sender has written a chunk of the
	// segment it completed into this member's result.
	flagPushed uint8 = 2
	// flagArena marks an announce: offset is where the sender's result
	// lies in its arena, or noArena.
	flagArena uint8 = 4
	// stepAnnounce is the step of an announce.
	stepAnnounce = 1<<32 - 2
	// noArena is the offset of an announce whose sender does not push.
	noArena = 1<<64 - 1
)

// pusher is a connection whose two processes map each other's arena: the
// shared-memory connection, where both sides could.
type pusher interface {
	pushes() bool                               // both sides mapped the other's arena
	pushTo(off, n int, fill func([]byte)) error // have fill write the n bytes at off of the peer's arena
	peerArenaLen() int
}

func init() {
	shmbridge.OutputBuffer = func(g any, n int) shmbridge.Buffer {
		if b := g.(*Group).outputBuffer(n); b != nil {
			return b
		}
		return nil // not a nil *sharedBuffer
	}
}

// outputBuffer returns a buffer of n bytes for the result of an
// AllReduceTo, in memory that every peer of the group maps, so that the
// all-reduce writes their parts of the result there directly; nil when
// the group has no such memory (a peer elsewhere or over TCP, a buffer
// smaller than the all-reduces that push, or the memory is used up): the
// caller then uses its own. The caller releases it when done with the
// result. tfdist's all-reduce kernel reaches it through
// shmbridge.OutputBuffer.
func (g *Group) outputBuffer(n int) *sharedBuffer {
	if g.arena == nil || n < g.cfg.pushMin || !g.allPush() {
		return nil
	}
	return g.arena.alloc(n)
}

// sharedBuffer is memory for the result of an all-reduce that the group's
// peers on this host map (see Group.outputBuffer): a shmbridge.Buffer.
type sharedBuffer struct {
	a    *arena
	slot int
	off  int
	b    []byte
}

// Bytes returns the buffer's memory.
func (b *sharedBuffer) Bytes() []byte { return b.b }

// Release gives the buffer back; its memory must not be used afterwards.
func (b *sharedBuffer) Release() { b.a.release(b.slot) }

// ReleaseFlag returns the address of a 32-bit flag outside Go's heap:
// storing 1 in it (atomically, from any thread) releases the buffer, so
// that a C deallocator, such as a TensorFlow tensor's, can.
func (b *sharedBuffer) ReleaseFlag() unsafe.Pointer { return b.a.flag(b.slot) }

// linkPushes reports whether the link to peer maps both arenas.
func (g *Group) linkPushes(peer int) bool {
	c := g.conns[peer]
	return c != nil && c.push != nil && c.push.pushes()
}

// allPush reports whether every link of this member maps both arenas.
func (g *Group) allPush() bool {
	for _, p := range g.peers {
		if !g.linkPushes(p) {
			return false
		}
	}
	return len(g.peers) > 0
}

// negotiatePush announces where dst lies to every peer whose link pushes
// and reads their announces. It returns, by rank, where each peer's
// result lies in its arena when the call pushes, else nil.
func (o *op) negotiatePush(dst, src []byte) ([]int, error) {
	g := o.g
	if len(dst) < g.cfg.pushMin {
		return nil, nil
	}
	var linked []int
	for _, p := range g.peers {
		if g.linkPushes(p) {
			linked = append(linked, p)
		}
	}
	if len(linked) == 0 {
		return nil, nil
	}
	off, inArena := g.arena.offset(dst)
	push := inArena && len(linked) == len(g.peers) && unsafe.SliceData(dst) != unsafe.SliceData(src)
	mine := -1 // noArena
	if push {
		// From here on a peer may write into dst, even should this call
		// fail before it learns whether every member pushes.
		mine, o.pushedTo, o.pushedInto = off, true, off
	}
	for _, p := range linked {
		if err := o.sendWith(flagArena, p, stepAnnounce, 0, mine, nil); err != nil {
			return nil, err
		}
	}
	offs := make([]int, len(g.members))
	for i, p := range linked {
		at, err := o.announced(p, linked[i+1:], len(dst))
		if err != nil {
			return nil, err
		}
		push = push && at >= 0
		offs[p] = at
	}
	if !push {
		return nil, nil
	}
	o.self.wire = 0 // no link to spare: every member pushes float32
	return offs, nil
}

// announced reads peer's announce and returns its offset, or -1 for
// noArena.
func (o *op) announced(peer int, later []int, n int) (int, error) {
	f, err := o.recv(peer, later)
	if err != nil {
		return 0, err
	}
	f.release()
	h := &f.h
	switch {
	case f.err != nil:
		return 0, f.err
	case h.flags != flagArena || h.step != stepAnnounce || h.length != 0:
		return 0, o.protocolErr(peer, "step %d chunk %d of %d bytes, want where its result lies", h.step, h.chunk, h.length)
	case h.offset == noArena:
		return -1, nil
	case h.offset > uint64(max(0, o.g.conns[peer].push.peerArenaLen()-n)):
		if gerr := o.g.Err(); gerr != nil {
			return 0, gerr // the group broke, which closed the connection: its arena reads as empty
		}
		return 0, o.protocolErr(peer, "a result of %d bytes at %d, outside its arena", n, h.offset)
	}
	return int(h.offset), nil
}

// pushChunk writes chunk c of the segment this member has just completed
// (out, at byte offset at of the result) into every peer's result and
// sends each its notice.
func (o *op) pushChunk(offs []int, c, at, wireOffset int, out []byte) error {
	n := len(o.g.members)
	for _, p := range o.g.peers {
		if err := o.push(p, offs[p]+at, n-1, c, wireOffset, out); err != nil {
			return err
		}
	}
	return nil
}

// pushStep is ringStep's part for a frame of a call that pushes: a notice
// that the previous member wrote its part of chunk c of step k into dst.
// A reduce-scatter step reduces it with src's chunk, unless the reader did
// as it arrived, and writes the result into the next member's result, or,
// on the last step, which completes the chunk, into every peer's.
func (o *op) pushStep(rr *ringRecv, f *frame, next int) error {
	k, c, n := int(f.h.step), int(f.h.chunk), rr.r.n
	if k == n-1 {
		return nil // the all-gather's notice: the chunk is complete in dst
	}
	out, local := rr.chunk(&f.h)
	lo, _ := rr.elems(k, c)
	at := lo * o.self.dtype.Size()
	switch {
	case k == n-2 && rr.fuse:
		return o.pushSum(rr, c, at, int(f.h.offset), out, local)
	case !f.applied:
		o.ringApply(k, out, local, out)
	}
	if k == n-2 {
		return o.pushChunk(rr.offs, c, at, int(f.h.offset), out)
	}
	defer rr.sentChunk(c)
	return o.pushNext(rr, next, k+1, c, at, out)
}

// pushSum completes chunk c of this member's segment of a float32 sum,
// the previous member's part in out and this member's in local, writing
// the sum into out and the first peer's result in one pass, and pushes it
// to the other peers.
func (o *op) pushSum(rr *ringRecv, c, at, wireOffset int, out, local []byte) error {
	peers, k := o.g.peers, rr.r.n-1
	first := peers[0]
	err := o.pushWith(first, rr.offs[first]+at, k, c, wireOffset, len(out), func(p []byte) {
		addFloat32Two(view[float32](out), view[float32](p), view[float32](local), view[float32](out))
	})
	for _, p := range peers[1:] {
		if err != nil {
			break
		}
		err = o.push(p, rr.offs[p]+at, k, c, wireOffset, out)
	}
	return err
}

// pushNext writes chunk c of reduce-scatter step k (data, at byte offset
// at of the result) into the next member's result and sends it the notice.
func (o *op) pushNext(rr *ringRecv, next, k, c, at int, data []byte) error {
	return o.push(next, rr.offs[next]+at, k, c, at, data)
}

// push writes data into peer's arena at off and sends peer the notice of
// chunk c of step k, at offset wireOffset of the call's buffer.
func (o *op) push(peer, off, k, c, wireOffset int, data []byte) error {
	return o.pushWith(peer, off, k, c, wireOffset, len(data), func(p []byte) { copy(p, data) })
}

// pushWith is push with fill writing the n bytes into peer's arena.
func (o *op) pushWith(peer, off, k, c, wireOffset, n int, fill func([]byte)) error {
	if hook := o.g.cfg.beforePush; hook != nil {
		hook(k, c)
	}
	if err := o.g.conns[peer].push.pushTo(off, n, fill); err != nil {
		if gerr := o.g.Err(); gerr != nil {
			return gerr // the group broke, which closed the connection
		}
		return o.g.writeFailed(peer, fmt.Errorf("%s %q: writing its result: %w", o.self.op, o.name, err))
	}
	o.g.pushed.Add(1)
	o.g.sent.Add(int64(n)) // the chunk's bytes, as if they had gone in the frame
	return o.sendWith(flagPushed, peer, k, c, wireOffset, nil)
}

// awaitPushes waits for the notices of every chunk of every segment that a
// peer other than the previous member completes (the previous member's
// come through the ring).
func (o *op) awaitPushes(rr *ringRecv) error {
	g := o.g
	for _, p := range g.peers {
		if p == rr.from {
			continue
		}
		seen := make([]bool, rr.r.chunks)
		for range rr.r.chunks {
			f, err := o.recv(p, nil)
			if err != nil {
				return err
			}
			f.release()
			h := &f.h
			c := int(h.chunk)
			if f.err != nil {
				return f.err
			}
			if h.flags != flagPushed || int(h.step) != len(g.members)-1 || c >= len(seen) || seen[c] || h.length != 0 {
				return o.protocolErr(p, "step %d chunk %d of %d bytes, want a notice of its segment", h.step, h.chunk, h.length)
			}
			seen[c] = true
		}
	}
	return nil
}
