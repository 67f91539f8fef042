package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Remote chunks: a single copy between processes on one host. Over
// shared memory a ring all-reduce's chunk would be copied twice, into the
// segment by the sender and out of it by the receiver. When the receiver
// can read the sender's memory (process_vm_readv, as MPI's single-copy
// transports do), the sender sends the chunk's address instead (a data
// frame flagged flagRemote, whose payload is a remoteRef), and the
// receiver reads the chunk from the sender's buffer straight into its own
// and reduces it there: half the memory traffic, which decides the
// all-reduce's speed on a host.
//
// The sender's memory is safe to read while its call runs: the ring only
// ever overwrites a region after the next member has read it, since what
// overwrites it comes around the ring from that member. It stays exposed
// until the next member says, with an empty flagged frame of the step after
// the last, that it has read every chunk; only then does the call end.
// A call that ends otherwise (an error, a cancelled context) revokes its
// lease first: a read that overlaps the revocation fails, loudly, instead
// of taking bytes the caller may have reused.

// remoteMem is a connection whose two processes may read each other's
// memory: the shared-memory connection, where the platform allows it.
type remoteMem interface {
	canRead() bool   // this member can read the peer's memory
	peerReads() bool // the peer can read this member's memory
	readRemote(dst []byte, addr uint64) error
	lease() (slot int, gen uint64, ok bool)
	revoke(slot int)
	leaseHeld(slot int, gen uint64) bool
}

// defaultRemoteMin is the smallest chunk sent as its address: below it,
// the system call costs more than the copy it saves.
const defaultRemoteMin = 64 << 10

// remoteRef is the payload of a remote chunk: the address of the chunk in
// the sender's memory, and the lease that vouches for it.
//
//	0 address u64 | 8 generation u64 | 16 slot u32 | 20 zero u32
const remoteRefLen = 24

// remoteLease is a call's lease on the connection it sends remote chunks
// over.
type remoteLease struct {
	conn remoteMem
	slot int
	gen  uint64
}

// remoteRef returns the payload that sends data to peer to as its address,
// or false if the chunk goes as bytes: compressed, small, or to a peer that
// cannot read this member's memory.
func (o *op) remoteRef(to int, data []byte) ([]byte, bool) {
	if min := o.g.cfg.remoteMin; o.self.wire != 0 || min <= 0 || len(data) < min {
		return nil, false
	}
	if o.lease == nil {
		rc := o.g.conns[to].remote
		if rc == nil || !rc.peerReads() {
			return nil, false
		}
		slot, gen, ok := rc.lease()
		if !ok {
			return nil, false
		}
		o.lease = &remoteLease{conn: rc, slot: slot, gen: gen}
	}
	le := binary.LittleEndian
	b := o.ref[:0]
	b = le.AppendUint64(b, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(data)))))
	b = le.AppendUint64(b, o.lease.gen)
	b = le.AppendUint32(b, uint32(o.lease.slot))
	return le.AppendUint32(b, 0), true
}

// sendChunk sends a ring all-reduce's chunk to peer to, as its address
// when it can (see remoteRef), else as bytes.
func (o *op) sendChunk(to, step, chunk, offset int, data []byte) error {
	ref, ok := o.remoteRef(to, data)
	if !ok {
		return o.send(to, step, chunk, offset, data)
	}
	o.self.flags = flagRemote
	defer func() { o.self.flags = 0 }()
	if err := o.send(to, step, chunk, offset, ref); err != nil {
		return err
	}
	o.g.sent.Add(int64(len(data) - len(ref))) // the peer takes the chunk itself
	return nil
}

// revokeLease ends the call's lease, if it took one.
func (o *op) revokeLease() {
	if o.lease != nil {
		o.lease.conn.revoke(o.lease.slot)
		o.lease = nil
	}
}

// fetch reads the remote chunk of frame h from the previous member's memory
// into dst and, in the reduce-scatter, reduces it with local as ringApply
// does a chunk that came as bytes. A float32 sum into a buffer apart from
// local reduces in place; other reductions read into a pooled buffer
// first. A chunk the peer released while it was read (its call ended
// early) fails with errReleased.
func (rr *ringRecv) fetch(h *header, dst, local, ref []byte) error {
	o, k := rr.o, int(h.step)
	le := binary.LittleEndian
	addr, gen, slot := le.Uint64(ref), le.Uint64(ref[8:]), int(le.Uint32(ref[16:]))
	reduce := k < rr.r.n-1
	into := dst
	if reduce && (unsafe.SliceData(dst) == unsafe.SliceData(local) || !addsInOnePass(o.self.red, o.self.dtype, dst, local, dst)) {
		b := getBuf(len(dst))
		defer putBuf(b)
		into = *b
	}
	if hook := o.g.cfg.beforeRemote; hook != nil {
		hook(k, int(h.chunk))
	}
	if err := rr.remote.readRemote(into, addr); err != nil {
		return o.g.peerError(rr.from, fmt.Errorf("%s %q: %w", o.self.op, o.name, err))
	}
	if !rr.remote.leaseHeld(slot, gen) {
		return errReleased
	}
	if reduce {
		o.ringApply(k, dst, local, into)
	}
	o.g.remoteReads.Add(1)
	return nil
}

// errReleased fails the read of a chunk whose sender's call ended while it
// was read: the sender's abort, if it failed, says why.
var errReleased = errors.New("the peer released a chunk while this member read it")

// awaitEnd waits, once peer has ended its part of the call early, for
// what ends this one: the group breaking (the peer's abort names the
// cause), the context, or the timeout, which names the peer.
func (o *op) awaitEnd(peer int) error {
	for {
		if err := o.wait(peer, nil); err != nil {
			return err
		}
	}
}

// doneStep is the step of the empty flagged frame that tells the previous
// member this one has read every remote chunk it was sent.
func (rr *ringRecv) doneStep() int { return 2 * (rr.r.n - 1) }

// finishRemote ends a ring all-reduce that moved remote chunks: it tells
// the previous member that every chunk it sent so has been read, and waits
// until the next member says the same of this member's, so that the call
// returns its buffers only once no peer reads them.
func (o *op) finishRemote(rr *ringRecv, next int) error {
	g := o.g
	g.mu.Lock()
	read := rr.remoteIn
	g.mu.Unlock()
	if read {
		o.self.flags = flagRemote
		err := o.send(rr.from, rr.doneStep(), 0, 0, nil)
		o.self.flags = 0
		if err != nil {
			return err
		}
	}
	if o.lease == nil {
		return nil
	}
	f, err := o.recv(next, nil)
	if err != nil {
		return err
	}
	defer f.release()
	switch {
	case f.err != nil:
		return f.err
	case f.h.flags != flagRemote || int(f.h.step) != rr.doneStep() || f.h.length != 0:
		return o.protocolErr(next, "step %d chunk %d of %d bytes, want the end of its reads", f.h.step, f.h.chunk, f.h.length)
	}
	return nil
}
