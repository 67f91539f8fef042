package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Remote chunks: a single copy between processes on one host. Over
// shared memory a chunk (of an all-reduce's ring, an all-gather or a
// broadcast) would be copied twice, into the segment by the sender and
// out of it by the receiver. When the receiver
// can read the sender's memory (process_vm_readv, as MPI's single-copy
// transports do), the sender sends the chunk's address instead (a data
// frame flagged flagRemote, whose payload is a remoteRef), and the
// receiver reads the chunk from the sender's buffer straight into its own
// and reduces it there: half the memory traffic, which decides the
// all-reduce's speed on a host.
//
// The sender's memory is safe to read while its call runs: the ring only
// ever overwrites a region after the next member has read it, since what
// overwrites it comes around the ring from that member, and gathers and
// broadcasts do not write what they send. It stays exposed until each
// peer it went to says, with an empty flagged frame (step stepReadsDone),
// that it has read every chunk; only then does the call end.
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

// remoteLease is a call's lease on a connection it sends remote chunks
// over.
type remoteLease struct {
	conn remoteMem
	slot int
	gen  uint64
}

// stepReadsDone is the step of the empty flagged frame by which a member
// tells a peer that it has read every remote chunk the peer sent it in
// the call.
const stepReadsDone = 1<<32 - 1

// leaseTo returns the call's lease on the connection to peer, taking one
// if the peer reads this member's memory; nil if it does not, or no slot
// is free.
func (o *op) leaseTo(peer int) *remoteLease {
	if o.leases == nil {
		o.leases = make([]*remoteLease, len(o.g.members))
	}
	if l := o.leases[peer]; l != nil {
		return l
	}
	rc := o.g.conns[peer].remote
	if rc == nil || !rc.peerReads() {
		return nil
	}
	slot, gen, ok := rc.lease()
	if !ok {
		return nil
	}
	o.leases[peer] = &remoteLease{conn: rc, slot: slot, gen: gen}
	return o.leases[peer]
}

// remoteRef returns the payload that sends data to peer to as its address,
// or false if the chunk goes as bytes: compressed, small, or to a peer that
// cannot read this member's memory.
func (o *op) remoteRef(to int, data []byte) ([]byte, bool) {
	if min := o.g.cfg.remoteMin; o.self.wire != 0 || min <= 0 || len(data) < min {
		return nil, false
	}
	l := o.leaseTo(to)
	if l == nil {
		return nil, false
	}
	// The address is an integer, which keeps nothing alive: a buffer that
	// only the call's arguments held, such as a temporary one the caller
	// built for it, could be collected and its memory reused while the
	// peer reads it, after the call's last use of it here.
	o.exposed = append(o.exposed, data)
	le := binary.LittleEndian
	b := o.ref[:0]
	b = le.AppendUint64(b, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(data)))))
	b = le.AppendUint64(b, l.gen)
	b = le.AppendUint32(b, uint32(l.slot))
	return le.AppendUint32(b, 0), true
}

// sendChunk sends a chunk to peer to, as its address when it can (see
// remoteRef), else as bytes.
func (o *op) sendChunk(to, step, chunk, offset int, data []byte) error {
	ref, ok := o.remoteRef(to, data)
	if !ok {
		return o.send(to, step, chunk, offset, data)
	}
	if err := o.sendWith(flagRemote, to, step, chunk, offset, ref); err != nil {
		return err
	}
	o.g.sent.Add(int64(len(data) - len(ref))) // the peer takes the chunk itself
	return nil
}

// sendWith sends a data frame flagged flag.
func (o *op) sendWith(flag uint8, to, step, chunk, offset int, payload []byte) error {
	o.self.flags = flag
	defer func() { o.self.flags = 0 }()
	return o.send(to, step, chunk, offset, payload)
}

// revokeLeases ends the call's leases.
func (o *op) revokeLeases() {
	for p, l := range o.leases {
		if l != nil {
			l.conn.revoke(l.slot)
			o.leases[p] = nil
		}
	}
}

// readable reports whether this member may take remote chunks from peer.
func (o *op) readable(peer int) bool {
	c := o.g.conns[peer]
	return c != nil && c.remote != nil && c.remote.canRead()
}

// unreadable is the error of a remote chunk from peer that this member
// may not take.
func (o *op) unreadable(peer int) error {
	return o.protocolErr(peer, "a chunk to read from its memory, which this member cannot")
}

// readChunk copies the remote chunk of frame h, whose payload is ref, from
// peer's memory into dst. A chunk the peer released while it was read (its
// call ended early) fails with errReleased.
func (o *op) readChunk(peer int, h *header, dst, ref []byte) error {
	le := binary.LittleEndian
	addr, gen, slot := le.Uint64(ref), le.Uint64(ref[8:]), int(le.Uint32(ref[16:]))
	if hook := o.g.cfg.beforeRemote; hook != nil {
		hook(int(h.step), int(h.chunk))
	}
	rc := o.g.conns[peer].remote
	if err := rc.readRemote(dst, addr); err != nil {
		return o.g.peerError(peer, fmt.Errorf("%s %q: %w", o.self.op, o.name, err))
	}
	if !rc.leaseHeld(slot, gen) {
		return errReleased
	}
	o.g.remoteReads.Add(1)
	return nil
}

// markRead records that the call read a remote chunk from peer.
func (o *op) markRead(peer int) {
	if o.readFrom == nil {
		o.readFrom = make([]bool, len(o.g.members))
	}
	o.readFrom[peer] = true
}

// fetch reads the remote chunk of frame h from the previous member's memory
// into dst and, in the reduce-scatter, reduces it with local as ringApply
// does a chunk that came as bytes. A float32 sum into a buffer apart from
// local reduces in place; other reductions read into a pooled buffer
// first.
func (rr *ringRecv) fetch(h *header, dst, local, ref []byte) error {
	o, k := rr.o, int(h.step)
	reduce := k < rr.r.n-1
	into := dst
	if reduce && (unsafe.SliceData(dst) == unsafe.SliceData(local) || !addsInOnePass(o.self.red, o.self.dtype, dst, local, dst)) {
		b := getBuf(len(dst))
		defer putBuf(b)
		into = *b
	}
	if err := o.readChunk(rr.from, h, into, ref); err != nil {
		return err
	}
	if reduce {
		o.ringApply(k, dst, local, into)
	}
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

// endReads ends a call that moved remote chunks: it tells every peer it
// read chunks from that it has read them all, and waits until every peer
// it sent chunks to as addresses says the same, so that the call returns
// its buffers only once no peer reads them.
func (o *op) endReads() error {
	for p, read := range o.readFrom {
		if read {
			if err := o.sendWith(flagRemote, p, stepReadsDone, 0, 0, nil); err != nil {
				return err
			}
		}
	}
	for p, l := range o.leases {
		if l == nil {
			continue
		}
		f, err := o.recv(p, nil)
		if err != nil {
			return err
		}
		f.release()
		switch {
		case f.err != nil:
			return f.err
		case f.h.flags != flagRemote || f.h.step != stepReadsDone || f.h.length != 0:
			return o.protocolErr(p, "step %d chunk %d of %d bytes, want the end of its reads", f.h.step, f.h.chunk, f.h.length)
		}
	}
	return nil
}
