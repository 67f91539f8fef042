package collective

import (
	"context"
	"errors"
	"fmt"
)

// AllGather returns every member's buffer in rank order, this member's
// included (as a copy). Members' buffers may differ in length but must hold
// the same dtype.
func (g *Group) AllGather(ctx context.Context, name string, dt DType, data []byte, opts ...CallOption) ([][]byte, error) {
	if err := checkArgs(opAllGather, name, dt, data); err != nil {
		return nil, err
	}
	h, err := withOptions(header{op: opAllGather, dtype: dt, count: uint64(len(data) / dt.Size())}, opts)
	if err != nil {
		return nil, fmt.Errorf("collective: all-gather %q: %w", name, err)
	}
	out := make([][]byte, len(g.members))
	out[g.rank] = append([]byte{}, data...)
	if len(g.members) == 1 {
		return out, g.Err()
	}
	o, err := g.start(ctx, name, h)
	if err != nil {
		return nil, err
	}
	if err := o.end(o.gather(data, out)); err != nil {
		return nil, err
	}
	return out, nil
}

func (o *op) gather(data []byte, out [][]byte) error {
	peers := o.g.peers
	if err := o.sendChunks(peers, data); err != nil {
		return err
	}
	for i, p := range peers {
		if err := o.recvChunks(p, peers[i+1:], &out[p]); err != nil {
			return err
		}
	}
	return o.endReads()
}

// Broadcast overwrites data on every member with root's data. Every member
// must pass the same root and length.
func (g *Group) Broadcast(ctx context.Context, name string, root int, dt DType, data []byte, opts ...CallOption) error {
	if err := checkArgs(opBroadcast, name, dt, data); err != nil {
		return err
	}
	if root < 0 || root >= len(g.members) {
		return fmt.Errorf("collective: broadcast %q: root %d out of range for %d members", name, root, len(g.members))
	}
	h, err := withOptions(header{op: opBroadcast, dtype: dt, count: uint64(len(data) / dt.Size()), root: uint32(root)}, opts)
	if err != nil {
		return fmt.Errorf("collective: broadcast %q: %w", name, err)
	}
	if len(g.members) == 1 {
		return g.Err()
	}
	o, err := g.start(ctx, name, h)
	if err != nil {
		return err
	}
	if root == g.rank {
		return o.end(o.broadcastRoot(data))
	}
	return o.end(o.broadcastLeaf(root, data))
}

// broadcastRoot sends data to every peer, then collects each peer's
// ready frame, which tells the root that the peer agrees on the call.
func (o *op) broadcastRoot(data []byte) error {
	peers := o.g.peers
	if err := o.sendChunks(peers, data); err != nil {
		return err
	}
	for i, p := range peers {
		f, err := o.recv(p, peers[i+1:])
		f.release()
		if err != nil {
			return err
		}
	}
	return o.endReads()
}

func (o *op) broadcastLeaf(root int, data []byte) error {
	if err := o.send(root, 0, 0, 0, nil); err != nil {
		return err
	}
	if err := o.recvChunks(root, nil, &data); err != nil {
		return err
	}
	return o.endReads()
}

// Barrier returns once every member has called it with name.
func (g *Group) Barrier(ctx context.Context, name string) error {
	if err := checkArgs(opBarrier, name, Int32, nil); err != nil {
		return err
	}
	return g.barrier(ctx, name)
}

func (g *Group) barrier(ctx context.Context, name string) error {
	if len(g.members) == 1 {
		return g.Err()
	}
	o, err := g.start(ctx, name, header{op: opBarrier})
	if err != nil {
		return err
	}
	return o.end(o.gather(nil, make([][]byte, len(g.members))))
}

// maxElems bounds the element count a peer may announce.
const maxElems = 1 << 40

// chunking cuts a buffer of total bytes into frames of whole elements of at
// most chunkBytes; an empty buffer is one empty frame.
type chunking struct{ total, per int }

func (o *op) chunking(total int) chunking {
	elem := max(1, o.self.dtype.Size())
	return chunking{total: total, per: max(elem, o.g.cfg.chunkBytes/elem*elem)}
}

func (c chunking) count() int { return max(1, (c.total+c.per-1)/c.per) }

func (c chunking) bounds(i int) (lo, hi int) { return i * c.per, min(c.total, (i+1)*c.per) }

// sendChunks sends data to each of peers, chunk by chunk.
func (o *op) sendChunks(peers []int, data []byte) error {
	ch := o.chunking(len(data))
	for i := range ch.count() {
		lo, hi := ch.bounds(i)
		for _, p := range peers {
			if err := o.sendChunk(p, 0, i, lo, data[lo:hi]); err != nil {
				return err
			}
		}
	}
	return nil
}

// recvChunks receives a buffer sent by sendChunks from peer into *dst,
// allocating it if nil.
func (o *op) recvChunks(peer int, later []int, dst *[]byte) error {
	var ch chunking
	for i := 0; i == 0 || i < ch.count(); i++ {
		f, err := o.recv(peer, later)
		if err != nil {
			return err
		}
		if i == 0 {
			if f.h.count > maxElems {
				f.release()
				return o.protocolErr(peer, "%d elements", f.h.count)
			}
			ch = o.chunking(int(f.h.count) * o.self.dtype.Size())
			if *dst == nil {
				*dst = make([]byte, ch.total)
			}
		}
		if len(*dst) != ch.total {
			f.release()
			return o.protocolErr(peer, "%d elements, want %d bytes", f.h.count, len(*dst))
		}
		lo, hi := ch.bounds(i)
		err = o.takeChunkFrame(peer, &f, 0, i, lo, (*dst)[lo:hi])
		f.release()
		if err != nil {
			return err
		}
	}
	return nil
}

// takeChunkFrame takes f, from peer, into dst once it checks that f is
// chunk i of step, at byte offset off of the call's buffer and of dst's
// length (or its address).
func (o *op) takeChunkFrame(peer int, f *frame, step, i, off int, dst []byte) error {
	length, remote := len(dst), f.h.flags&flagRemote != 0
	if remote {
		length = remoteRefLen
	}
	if int(f.h.step) != step || int(f.h.chunk) != i || f.h.offset != uint64(off) || int(f.h.length) != length {
		return o.protocolErr(peer, "step %d chunk %d at %d+%d, want step %d chunk %d at %d+%d",
			f.h.step, f.h.chunk, f.h.offset, f.h.length, step, i, off, length)
	}
	return o.takeChunk(peer, f, dst, remote)
}

// takeChunk copies a frame's chunk into dst: its payload, or the remote
// chunk it points to.
func (o *op) takeChunk(peer int, f *frame, dst []byte, remote bool) error {
	if !remote {
		copy(dst, f.payload())
		return nil
	}
	if !o.readable(peer) {
		return o.unreadable(peer)
	}
	err := o.readChunk(peer, &f.h, dst, f.payload())
	switch {
	case errors.Is(err, errReleased):
		return o.awaitEnd(peer)
	case err != nil:
		return err
	}
	o.markRead(peer)
	return nil
}
