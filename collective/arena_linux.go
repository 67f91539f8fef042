//go:build linux

package collective

import (
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The arena: this process's memory for all-reduce results that its peers
// on the host map and write into (see push.go). It is one sealed memfd,
// reserved once per process and shared by every group, mapped by each
// peer that joins over shared memory. Pages are allocated when first
// written, and spans are reused once released.
const (
	arenaBytes = 4 << 30 // the memfd's size: address space, not memory, until written
	arenaAlign = 4096    // spans start on a page
	arenaSlots = 1024    // most buffers alive at once
)

// arena hands out spans of its memfd as sharedBuffers. A sharedBuffer is
// released by storing 1 in its slot's flag (which a C deallocator can do
// from any thread); the next allocation takes released spans back.
type arena struct {
	fd    int
	mem   []byte
	flags []atomic.Uint32 // by slot: 1 once released; outside Go's heap

	mu     sync.Mutex
	free   []span       // by offset, merged
	live   map[int]span // by slot
	kept   map[int]bool // slots a failed call quarantined: never reused
	unused []int        // free slots
}

type span struct{ off, n int }

var (
	arenaOnce sync.Once
	theArena  *arena
	arenaErr  error
)

// processArena returns this process's arena, creating it on first use.
func processArena() (*arena, error) {
	arenaOnce.Do(func() { theArena, arenaErr = newArena(arenaBytes) })
	return theArena, arenaErr
}

func newArena(size int) (*arena, error) {
	fd, err := unix.MemfdCreate("tfdist-collective-arena", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("arena: memfd_create: %w", err)
	}
	mem, err := func() ([]byte, error) {
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			return nil, fmt.Errorf("arena: sizing: %w", err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals); err != nil {
			return nil, fmt.Errorf("arena: sealing: %w", err)
		}
		return mapArena(fd, size)
	}()
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	flagMem, err := unix.Mmap(-1, 0, 4*arenaSlots, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		_ = unix.Munmap(mem)
		_ = unix.Close(fd)
		return nil, fmt.Errorf("arena: flags: %w", err)
	}
	a := &arena{fd: fd, mem: mem, flags: unsafe.Slice((*atomic.Uint32)(unsafe.Pointer(&flagMem[0])), arenaSlots),
		free: []span{{0, size}}, live: make(map[int]span), kept: make(map[int]bool)}
	for s := arenaSlots - 1; s >= 0; s-- {
		a.unused = append(a.unused, s)
	}
	return a, nil
}

// mapArena maps an arena's memfd of size bytes, shared and writable.
func mapArena(fd, size int) ([]byte, error) {
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("arena: mapping: %w", err)
	}
	return mem, nil
}

// alloc returns a sharedBuffer of n bytes, or nil when the arena has no room or
// no free slot.
func (a *arena) alloc(n int) *sharedBuffer {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reclaim()
	want := (n + arenaAlign - 1) / arenaAlign * arenaAlign
	if len(a.unused) == 0 || want == 0 {
		return nil
	}
	for i, s := range a.free {
		if s.n < want {
			continue
		}
		if s.n == want {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + want, s.n - want}
		}
		slot := a.unused[len(a.unused)-1]
		a.unused = a.unused[:len(a.unused)-1]
		a.live[slot] = span{s.off, want}
		a.flags[slot].Store(0)
		return &sharedBuffer{a: a, slot: slot, off: s.off, b: a.mem[s.off : s.off+n : s.off+n]}
	}
	return nil
}

// reclaim takes back the spans of released sharedBuffers. Caller holds a.mu.
func (a *arena) reclaim() {
	for slot, s := range a.live {
		if a.flags[slot].Load() == 0 {
			continue
		}
		delete(a.live, slot)
		if a.kept[slot] {
			delete(a.kept, slot) // the span stays out of use for good
		} else {
			a.give(s)
		}
		a.unused = append(a.unused, slot)
	}
}

// give returns s to the free list, merging it with its neighbours.
func (a *arena) give(s span) {
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > s.off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = s
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}

// offset returns where b lies in the arena, if it lies wholly inside.
func (a *arena) offset(b []byte) (int, bool) {
	if a == nil || len(b) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(a.mem)) {
		return 0, false
	}
	return int(p - base), true
}

// quarantine keeps the span of the live sharedBuffer at off out of use for good:
// a peer of a failed call may still write into it.
func (a *arena) quarantine(off int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for slot, s := range a.live {
		if off >= s.off && off < s.off+s.n {
			a.kept[slot] = true
			return
		}
	}
}

// release releases the sharedBuffer in slot.
func (a *arena) release(slot int) { a.flags[slot].Store(1) }

// flag returns the address of slot's release flag.
func (a *arena) flag(slot int) unsafe.Pointer { return unsafe.Pointer(&a.flags[slot]) }

// pushes reports whether this link pushes: each side mapped the other's
// arena.
func (c *shmConn) pushes() bool { return c.arenaBoth }

// pushTo has fill write the n bytes at off of the peer's arena.
func (c *shmConn) pushTo(off, n int, fill func(peer []byte)) error {
	if !c.acquire() {
		return net.ErrClosed
	}
	defer c.release()
	if off < 0 || n < 0 || off > len(c.peerArena)-n {
		return fmt.Errorf("%d bytes at %d of the peer's arena of %d", n, off, len(c.peerArena))
	}
	fill(c.peerArena[off : off+n])
	return nil
}

// peerArenaLen returns the length of the peer's arena, 0 once the
// connection is closed.
func (c *shmConn) peerArenaLen() int {
	if !c.acquire() {
		return 0
	}
	defer c.release()
	return len(c.peerArena)
}

// setArenaBoth records whether both sides mapped the other's arena.
func setArenaBoth(nc net.Conn, ok bool) {
	if c, is := nc.(*shmConn); is {
		c.arenaBoth = ok && c.peerArena != nil
	}
}

// arenaBoth reports what setArenaBoth recorded, or the dialer found.
func arenaBoth(nc net.Conn) bool {
	c, is := nc.(*shmConn)
	return is && c.arenaBoth
}

// mapPeerArena maps the arena memfd a peer sent, after checking that it is
// sealed (so that the peer cannot shrink it under this mapping).
func mapPeerArena(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("peer arena: %w", err)
	}
	if st.Size <= 0 || st.Size > arenaBytes || st.Size%arenaAlign != 0 {
		return nil, fmt.Errorf("peer arena of %d bytes", st.Size)
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&shmSeals != shmSeals {
		return nil, fmt.Errorf("peer arena not sealed (seals %#x, %v)", seals, err)
	}
	return mapArena(fd, int(st.Size))
}

// sendArena answers a dialer's segment: whether this side mapped the
// dialer's arena, and this process's arena, if it has one.
func sendArena(uc *net.UnixConn, mapped bool) error {
	var rights []byte
	if a, _ := processArena(); a != nil {
		rights = unix.UnixRights(a.fd)
	}
	_, _, err := uc.WriteMsgUnix([]byte{byte(btoi(mapped))}, rights, nil)
	return err
}

// receiveArena reads the acceptor's answer that sendArena wrote: its arena,
// mapped here (nil if it sent none or it cannot be mapped), and whether it
// mapped this process's.
func receiveArena(uc *net.UnixConn) (peer []byte, mapsMine bool, err error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, false, fmt.Errorf("reading the peer's arena: %w", err)
	}
	fds, err := receivedRights(oob[:oobn])
	if err != nil {
		return nil, false, fmt.Errorf("reading the peer's arena: %w", err)
	}
	defer closeFDs(fds)
	if n != 1 || len(fds) > 1 {
		return nil, false, fmt.Errorf("arena answer of %d bytes and %d descriptors", n, len(fds))
	}
	if len(fds) == 1 {
		peer, _ = mapPeerArena(fds[0]) // without it, this link does not push
	}
	return peer, b[0] == 1, nil
}
