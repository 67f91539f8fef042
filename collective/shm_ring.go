package collective

import (
	"errors"
	"sync/atomic"
	"unsafe"
)

// Layout of a shared-memory segment: one header page, then one ring per
// direction (0: dialer to acceptor, 1: acceptor to dialer).
//
//	0 magic u64 | 8 ring bytes u64
//	64 + 256*d: ring d's control block, each field on its own cache line:
//	  +0 head u64 (bytes written, by the writer) | +64 tail u64 (bytes read,
//	  by the reader) | +128 reader waiting u32 | +192 writer waiting u32 |
//	  +196 closed u32 (the writer will write no more)
//
// Each side maps every ring twice, back to back (see mapSegment), so that
// any run of up to a ring's length is contiguous in its memory, wherever
// it starts: the reader can reduce a frame's payload where it lies.
const (
	shmMagic       uint64 = 0x3147534d43444654 // "TFDCMSG1"
	shmHeaderBytes        = 4096
	shmRingBytes          = 4 << 20
)

// errRingCorrupt fails a ring whose shared counters make no sense: the
// peer wrote into the control block.
var errRingCorrupt = errors.New("shared memory: the peer corrupted the ring's counters")

// shmRing is one direction of a segment: a single-producer,
// single-consumer byte ring whose counters live in the shared page, so
// that two processes see the same values. Each side keeps its own counter
// in private memory too and only publishes it, so that a peer can corrupt
// at worst what it sends. Go's atomics are sequentially consistent, which
// the waiting flags rely on (see shmConn).
type shmRing struct {
	head          *atomic.Uint64
	tail          *atomic.Uint64
	readerWaiting *atomic.Uint32
	writerWaiting *atomic.Uint32
	closed        *atomic.Uint32
	data          []byte // the ring mapped twice: 2*size bytes
	size          uint64
	pos           uint64 // this side's own count: head for the writer, tail for the reader
}

// shmSegmentBytes is the size of a segment with rings of ringBytes.
func shmSegmentBytes(ringBytes int) int { return shmHeaderBytes + 2*ringBytes }

// shmMappedBytes is the memory a side maps for a segment with rings of
// ringBytes: the header page, then each ring twice.
func shmMappedBytes(ringBytes int) int { return shmHeaderBytes + 4*ringBytes }

// initShmHeader writes the header of a new, zeroed segment.
func initShmHeader(mem []byte, ringBytes int) {
	(*atomic.Uint64)(unsafe.Pointer(&mem[8])).Store(uint64(ringBytes))
	(*atomic.Uint64)(unsafe.Pointer(&mem[0])).Store(shmMagic)
}

// shmHeaderOK reports whether the mapping mem holds a segment of its size.
func shmHeaderOK(mem []byte) bool {
	if len(mem) < shmHeaderBytes {
		return false
	}
	magic := (*atomic.Uint64)(unsafe.Pointer(&mem[0])).Load()
	ring := (*atomic.Uint64)(unsafe.Pointer(&mem[8])).Load()
	return magic == shmMagic && ring > 0 && uint64(len(mem)) == uint64(shmHeaderBytes)+4*ring
}

// ringOf returns direction d of the segment mapped at mem.
func ringOf(mem []byte, d int) *shmRing {
	ringBytes := (len(mem) - shmHeaderBytes) / 4
	ctl := 64 + 256*d
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&mem[ctl+off]) }
	start := shmHeaderBytes + 2*d*ringBytes
	return &shmRing{
		head:          (*atomic.Uint64)(at(0)),
		tail:          (*atomic.Uint64)(at(64)),
		readerWaiting: (*atomic.Uint32)(at(128)),
		writerWaiting: (*atomic.Uint32)(at(192)),
		closed:        (*atomic.Uint32)(at(196)),
		data:          mem[start : start+2*ringBytes : start+2*ringBytes],
		size:          uint64(ringBytes),
	}
}

// free returns how many bytes the writer may write now.
func (r *shmRing) free() (int, error) {
	used := r.pos - r.tail.Load()
	if used > r.size {
		return 0, errRingCorrupt
	}
	return int(r.size - used), nil
}

// avail returns how many bytes the reader may read now.
func (r *shmRing) avail() (int, error) {
	n := r.head.Load() - r.pos
	if n > r.size {
		return 0, errRingCorrupt
	}
	return int(n), nil
}

// at returns the n bytes of the ring from this side's position on,
// contiguous thanks to the double mapping (n <= size).
func (r *shmRing) at(n int) []byte {
	i := int(r.pos % r.size)
	return r.data[i : i+n : i+n]
}

// put copies as much of p as fits and publishes it; writer side only.
func (r *shmRing) put(p []byte) (int, error) {
	free, err := r.free()
	if err != nil {
		return 0, err
	}
	n := copy(r.at(min(len(p), free)), p)
	r.pos += uint64(n)
	r.head.Store(r.pos)
	return n, nil
}

// get copies as much as is there into p and frees it; reader side only.
func (r *shmRing) get(p []byte) (int, error) {
	avail, err := r.avail()
	if err != nil {
		return 0, err
	}
	n := copy(p, r.at(min(len(p), avail)))
	r.skip(n)
	return n, nil
}

// skip frees the next n bytes, which the reader has read; reader side only.
func (r *shmRing) skip(n int) {
	r.pos += uint64(n)
	r.tail.Store(r.pos)
}
