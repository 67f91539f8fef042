package collective

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// frame is a received data frame: its header (without name) and payload.
type frame struct {
	h        header
	buf      *[]byte // pooled; nil for an empty payload or an applied one
	applied  bool    // the reader applied the payload to the call (see ringRecv)
	admitted bool    // the call's ring checked the frame
	err      error   // what that check found wrong
}

func (f *frame) payload() []byte {
	if f.buf == nil {
		return nil
	}
	return *f.buf
}

func (f *frame) release() {
	if f.buf != nil {
		putBuf(f.buf)
		f.buf = nil
	}
}

// mailbox buffers the frames of one operation (name, seq), per sending
// peer, in arrival order. Frames of an operation not yet started locally
// wait here until it starts.
type mailbox struct {
	queues    [][]frame     // by peer rank
	signal    chan struct{} // a frame arrived or a peer left
	active    bool          // a local operation owns the mailbox
	abandoned bool          // the local operation was cancelled; drop frames
	ring      *ringRecv     // the receive side of a ring all-reduce, if any
	first     []time.Time   // by peer rank: when its first frame arrived
}

func newMailbox(n int) *mailbox {
	return &mailbox{queues: make([][]frame, n), signal: make(chan struct{}, 1), first: make([]time.Time, n)}
}

func (b *mailbox) notify() {
	select {
	case b.signal <- struct{}{}:
	default:
	}
}

// pop removes the oldest frame from peer, if any.
func (b *mailbox) pop(peer int) (frame, bool) {
	q := b.queues[peer]
	if len(q) == 0 {
		return frame{}, false
	}
	f := q[0]
	q[0] = frame{}
	b.queues[peer] = q[1:]
	if len(q) == 1 {
		b.queues[peer] = q[:0]
	}
	return f, true
}

// drop releases every queued frame.
func (b *mailbox) drop() {
	for p, q := range b.queues {
		for i := range q {
			q[i].release()
		}
		b.queues[p] = nil
	}
}

// nameState is the matching state of one tensor name.
type nameState struct {
	next  uint64              // sequence number of the next local call
	boxes map[uint64]*mailbox // by sequence number
}

// box returns the mailbox of (name, seq), creating it. Caller holds g.mu.
func (g *Group) box(name []byte, seq uint64) *mailbox {
	ns := g.names[string(name)]
	if ns == nil {
		ns = &nameState{boxes: make(map[uint64]*mailbox)}
		g.names[string(name)] = ns
	}
	b := ns.boxes[seq]
	if b == nil {
		b = newMailbox(len(g.members))
		ns.boxes[seq] = b
	}
	return b
}

// deliver queues a data frame from peer, read into buf, for its
// operation.
func (g *Group) deliver(peer int, h header, buf *[]byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, f := g.arriveLocked(peer, h)
	f.buf = buf
	g.enqueueLocked(b, peer, f)
}

// deliverInPlace delivers a data frame from peer whose payload p lies in
// the connection's memory: the reader applies it to its call if the call
// takes it so (see ringRecv), else copies it into a buffer, in either case
// outside g.mu.
func (g *Group) deliverInPlace(peer int, h header, p []byte) {
	b, f, rr := g.arriveInPlace(peer, h)
	if b == nil {
		return
	}
	if rr != nil {
		if f.applied = rr.apply(&f, p); !f.applied {
			b = nil // the call has ended
		}
	} else {
		f.buf = getBuf(len(p))
		copy(*f.buf, p)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if rr != nil {
		if rr.applying--; rr.applying == 0 {
			g.applied.Broadcast()
		}
	}
	g.enqueueLocked(b, peer, f)
}

// arriveInPlace is arriveLocked for a frame that lies in place: when its
// call has a ring that takes frames so, the ring checks the frame and, if
// it may be applied, arriveInPlace returns the ring, counting the
// application in progress.
func (g *Group) arriveInPlace(peer int, h header) (*mailbox, frame, *ringRecv) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, f := g.arriveLocked(peer, h)
	if b == nil {
		return nil, f, nil
	}
	if rr := b.ring; rr != nil && peer == rr.from {
		var apply bool
		apply, f.err = rr.admit(&f.h)
		f.admitted = true
		if apply && f.err == nil {
			rr.applying++
			return b, f, rr
		}
	}
	return b, f, nil
}

// arriveLocked returns the mailbox of a data frame from peer, nil if the
// frame is to be dropped, and the frame. Caller holds g.mu.
func (g *Group) arriveLocked(peer int, h header) (*mailbox, frame) {
	if g.err != nil {
		return nil, frame{}
	}
	b := g.box(h.name, h.seq)
	if b.abandoned {
		return nil, frame{}
	}
	if b.first[peer].IsZero() {
		b.first[peer] = time.Now()
	}
	f := frame{h: h}
	f.h.name = nil
	f.h.dims = slices.Clone(h.dims) // h.dims aliases the reader's scratch
	return b, f
}

// enqueueLocked queues f, from peer, in b (dropping it if b is nil,
// abandoned or the group broken), having the call's ring check it if it
// has not. Caller holds g.mu.
func (g *Group) enqueueLocked(b *mailbox, peer int, f frame) {
	if b == nil || b.abandoned || g.err != nil {
		f.release()
		return
	}
	if r := b.ring; r != nil && peer == r.from && !f.admitted {
		_, f.err = r.admit(&f.h)
		f.admitted = true
	}
	b.queues[peer] = append(b.queues[peer], f)
	b.notify()
}

// peerLeft records that peer closed its group in order and wakes every
// operation, so those still needing it fail.
func (g *Group) peerLeft(peer int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.left[peer] = true
	g.notifyAllLocked()
}

// peerClosing records that peer is closing the group and starts no
// operation but its closing barrier, and wakes every operation, so those
// still waiting for it fail.
func (g *Group) peerClosing(peer int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closing[peer] = true
	g.notifyAllLocked()
}

// notifyAllLocked wakes every operation. Caller holds g.mu.
func (g *Group) notifyAllLocked() {
	for _, ns := range g.names {
		for _, b := range ns.boxes {
			b.notify()
		}
	}
}

// pendingLocked reports whether a local operation is in progress. Caller
// holds g.mu.
func (g *Group) pendingLocked() bool {
	for _, ns := range g.names {
		for _, b := range ns.boxes {
			if b.active && !b.abandoned {
				return true
			}
		}
	}
	return false
}

// orphans describes up to three operations peer has sent frames for that
// no local call has started: the usual cause of a stall is members calling
// different names. Caller holds g.mu.
func (g *Group) orphans(peer int) string {
	var found []string
	for name, ns := range g.names {
		for seq, b := range ns.boxes {
			if !b.active && !b.abandoned && len(b.queues[peer]) > 0 && len(found) < 3 {
				found = append(found, fmt.Sprintf("%q#%d", name, seq))
			}
		}
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("%s started %s, not started here", g.members[peer].Name, strings.Join(found, ", "))
}
