package collective

// ring partitions a buffer for the ring all-reduce: n segments (one per
// member, sizes differing by at most one element), each cut into the same
// number of chunks.
type ring struct {
	n, elem, chunks int
	elems           int // elements in the buffer
}

func newRing(bytes, n, elem, chunkBytes int) ring {
	r := ring{n: n, elem: elem, elems: bytes / elem}
	maxSeg := (r.elems + n - 1) / n * elem
	r.chunks = max(1, (maxSeg+chunkBytes-1)/chunkBytes)
	return r
}

// segment returns the first element and the length of segment s.
func (r ring) segment(s int) (start, n int) {
	q, rem := r.elems/r.n, r.elems%r.n
	return s*q + min(s, rem), q + btoi(s < rem)
}

// chunk returns the byte range of chunk c of segment s.
func (r ring) chunk(s, c int) (lo, hi int) {
	start, n := r.segment(s)
	return (start + n*c/r.chunks) * r.elem, (start + n*(c+1)/r.chunks) * r.elem
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
// keeps the ring busy. Each element is reduced along one fixed path and
// then copied, so every member ends with the same bits. Step 0 sends from
// src; every other segment is written into dst before it is sent, so dst
// needs no copy of src first.
func (o *op) ringReduce(dst, src []byte) error {
	g := o.g
	n, rank := len(g.members), g.rank
	next, prev := mod(rank+1, n), mod(rank-1, n)
	r := newRing(len(dst), n, o.self.dtype.Size(), g.cfg.chunkBytes)
	steps := 2 * (n - 1)
	expect := make([]int, r.chunks) // next step expected per chunk
	sent0 := 0
	for ; sent0 < min(g.cfg.ringWindow, r.chunks); sent0++ {
		if err := o.sendChunk(next, r, src, 0, sent0); err != nil {
			return err
		}
	}
	for range steps * r.chunks {
		k, c, err := o.ringRecv(prev, r, dst, src, expect)
		if err != nil {
			return err
		}
		if k+1 < steps {
			if err := o.sendChunk(next, r, dst, k+1, c); err != nil {
				return err
			}
		}
		if k == 0 && sent0 < r.chunks {
			if err := o.sendChunk(next, r, src, 0, sent0); err != nil {
				return err
			}
			sent0++
		}
	}
	return nil
}

// sendChunk sends chunk c of step k (segment rank-k).
func (o *op) sendChunk(to int, r ring, data []byte, k, c int) error {
	lo, hi := r.chunk(mod(o.g.rank-k, r.n), c)
	return o.send(to, k, c, lo, data[lo:hi])
}

// ringRecv receives the next chunk from prev, checks that it is the one the
// schedule allows, and reduces it with src's chunk or copies it into dst.
func (o *op) ringRecv(prev int, r ring, dst, src []byte, expect []int) (k, c int, err error) {
	f, err := o.recv(prev, nil)
	if err != nil {
		return 0, 0, err
	}
	defer f.release()
	k, c = int(f.h.step), int(f.h.chunk)
	if c >= r.chunks || expect[c] != k || k >= 2*(r.n-1) {
		return 0, 0, o.protocolErr(prev, "unexpected step %d chunk %d", k, c)
	}
	expect[c]++
	lo, hi := r.chunk(mod(o.g.rank-k-1, r.n), c)
	if f.h.offset != uint64(lo) || int(f.h.length) != hi-lo {
		return 0, 0, o.protocolErr(prev, "chunk at %d+%d, want %d+%d", f.h.offset, f.h.length, lo, hi-lo)
	}
	o.ringApply(k, dst[lo:hi], src[lo:hi], f.payload())
	return k, c, nil
}

// ringApply reduces (reduce-scatter: dst = local ∘ recv, where local is
// src's chunk, as each segment is received once then) or copies (all-gather)
// one chunk; the member that completes a segment's reduction applies Mean's
// division.
func (o *op) ringApply(k int, dst, local, recv []byte) {
	n := len(o.g.members)
	if k >= n-1 {
		copy(dst, recv)
		return
	}
	copyIfDistinct(dst, local)
	reduceInto(o.self.red, o.self.dtype, dst, recv)
	if k == n-2 && o.self.red == Mean {
		scale(o.self.dtype, dst, n)
	}
}
