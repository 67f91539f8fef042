//go:build linux

package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmSupported reports whether this platform has the shared-memory
// transport.
const shmSupported = true

// errPeerGone fails a write to a peer whose process has gone.
var errPeerGone = fmt.Errorf("shared memory: the peer's process has gone: %w", syscall.EPIPE)

// shmConn is a net.Conn between two processes on one host over a
// shared-memory segment: a byte ring per direction, and an eventfd per ring
// and side to wait on (data for the reader, space for the writer), polled
// by Go's netpoller so that waits honour deadlines. A side announces that
// it waits with a flag in the segment before it sleeps, and the other side
// signals only then. The Unix socket the segment came over stays open:
// its end tells that the peer's process has gone.
type shmConn struct {
	mem       []byte
	out, in   *shmRing
	dataIn    *os.File // this side waits here for data in `in`
	spaceOut  *os.File // this side waits here for space in `out`
	dataOut   *os.File // signals the peer: data in `out`
	spaceIn   *os.File // signals the peer: space in `in`
	ctl       *net.UnixConn
	watchDone chan struct{}
	local     net.Addr
	remote    net.Addr
	gone      atomic.Bool
	wclosed   atomic.Bool

	mu     sync.Mutex
	users  int  // Reads and Writes in progress
	closed bool // Close was called; the segment is unmapped once users is 0

	// The peer's arena (arena_linux.go): mapped here when it sent one, and
	// used once both sides have said they mapped the other's.
	peerArena []byte
	arenaBoth bool

	// Cross-memory reads (shm_remote_linux.go).
	side     int  // the ring this side writes: 0 for the dialer, 1 for the acceptor
	pid      int  // the peer's process, once known
	readable bool // this side can read the peer's memory (set before use)
	leaseMu  sync.Mutex
	leased   uint64 // bit i: slot i is leased
	gens     [shmLeases]uint64
}

// shmSeals fix a segment's size for good.
const shmSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// shmMaxRingBytes bounds the rings of a segment an acceptor maps.
const shmMaxRingBytes = 64 << 20

// eventfd order in the rights a dialer sends: ring 0's data and space,
// then ring 1's, the segment's memfd, and the dialer's arena if it has one.
const (
	efdData0 = iota
	efdSpace0
	efdData1
	efdSpace1
	shmFDs = 5
)

// newShmConn wraps a mapped segment and its eventfds; side is the ring this
// end writes (0 for the dialer, 1 for the acceptor). It takes ownership of
// every argument.
func newShmConn(mem []byte, efds [4]int, side int, ctl *net.UnixConn, local, remote net.Addr) *shmConn {
	file := func(i int) *os.File { return os.NewFile(uintptr(efds[i]), "tfdist-shm-eventfd") }
	d0, s0, d1, s1 := file(efdData0), file(efdSpace0), file(efdData1), file(efdSpace1)
	c := &shmConn{mem: mem, ctl: ctl, watchDone: make(chan struct{}), local: local, remote: remote, side: side}
	c.out, c.in = ringOf(mem, side), ringOf(mem, 1-side)
	if side == 0 {
		c.dataOut, c.spaceOut, c.dataIn, c.spaceIn = d0, s0, d1, s1
	} else {
		c.dataIn, c.spaceIn, c.dataOut, c.spaceOut = d0, s0, d1, s1
	}
	go c.watch()
	return c
}

// watch waits for the peer's end of the Unix socket to close, then wakes
// this side's waits so that they see the peer gone.
func (c *shmConn) watch() {
	defer close(c.watchDone)
	var b [1]byte
	for {
		if _, err := c.ctl.Read(b[:]); err != nil {
			break
		}
	}
	c.gone.Store(true)
	signal(c.dataIn)
	signal(c.spaceOut)
}

// signal adds one to an eventfd; an error means the conn is closing.
func signal(f *os.File) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = f.Write(one[:])
}

// sleep waits on an eventfd until it is signalled or its deadline passes.
func sleep(f *os.File) error {
	var b [8]byte
	_, err := f.Read(b[:])
	if errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

func (c *shmConn) acquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.users++
	return true
}

func (c *shmConn) release() {
	c.mu.Lock()
	c.users--
	unmap := c.closed && c.users == 0 && c.mem != nil
	mem, peerArena := c.mem, c.peerArena
	if unmap {
		c.mem, c.peerArena = nil, nil
	}
	c.mu.Unlock()
	if unmap {
		_ = unmapSegment(mem)
		if peerArena != nil {
			_ = unix.Munmap(peerArena)
		}
	}
}

// Write copies p into the outgoing ring, waiting for space as needed.
func (c *shmConn) Write(p []byte) (int, error) {
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.release()
	if c.wclosed.Load() {
		return 0, errStopping
	}
	r, n := c.out, 0
	for n < len(p) {
		if c.gone.Load() {
			return n, errPeerGone
		}
		k, err := r.put(p[n:])
		if err != nil {
			return n, err
		}
		if k == 0 {
			if err := c.waitSpace(); err != nil {
				return n, err
			}
			continue
		}
		n += k
		if r.readerWaiting.Load() != 0 {
			signal(c.dataOut)
		}
	}
	return n, nil
}

// waitSpace sleeps until the peer frees space in the outgoing ring. The
// flag is set before the ring is checked again, and the reader frees
// before it reads the flag, so one of them sees the other.
func (c *shmConn) waitSpace() error {
	r := c.out
	r.writerWaiting.Store(1)
	defer r.writerWaiting.Store(0)
	if free, err := r.free(); free > 0 || err != nil || c.gone.Load() {
		return nil
	}
	return sleep(c.spaceOut)
}

// Read copies what the incoming ring holds into p, waiting for data if it
// is empty. It returns io.EOF once the peer has closed its side, or its
// process has gone, and everything it wrote has been read.
func (c *shmConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.release()
	r := c.in
	for {
		n, err := r.get(p)
		if n > 0 || err != nil {
			if r.writerWaiting.Load() != 0 {
				signal(c.spaceIn)
			}
			return n, err
		}
		if r.closed.Load() != 0 || c.gone.Load() {
			if avail, err := r.avail(); avail > 0 || err != nil { // written before the close
				continue
			}
			return 0, io.EOF
		}
		if err := c.waitData(1); err != nil {
			return 0, err
		}
	}
}

// viewMax is the longest run of incoming bytes view can return.
func (c *shmConn) viewMax() int { return int(c.in.size) }

// view waits until n bytes (at most viewMax) have arrived and returns
// them in place, without consuming them: the reader, alone, may read them
// until it calls consume, which every view that returns no error needs.
// A peer that closes or goes before it has sent n bytes fails it with
// io.ErrUnexpectedEOF.
func (c *shmConn) view(n int) ([]byte, error) {
	if !c.acquire() {
		return nil, net.ErrClosed
	}
	r := c.in
	for {
		avail, err := r.avail()
		switch {
		case err != nil:
		case avail >= n:
			return r.at(n), nil
		case r.closed.Load() != 0 || c.gone.Load():
			if again, _ := r.avail(); again < n { // else written before the close
				err = io.ErrUnexpectedEOF
			}
		default:
			err = c.waitData(n)
		}
		if err != nil {
			c.release()
			return nil, err
		}
	}
}

// readPad returns the bytes from the read position to the next multiple
// of payloadAlign.
func (c *shmConn) readPad() int { return padTo(c.in.pos) }

// writePad returns the bytes from after bytes past the write position to
// the next multiple of payloadAlign; the caller holds the write side.
func (c *shmConn) writePad(after int) int { return padTo(c.out.pos + uint64(after)) }

// consume frees the n bytes a view returned.
func (c *shmConn) consume(n int) {
	r := c.in
	r.skip(n)
	if r.writerWaiting.Load() != 0 {
		signal(c.spaceIn)
	}
	c.release()
}

// waitData sleeps until the incoming ring holds n bytes, or the peer
// closes or goes. A wake-up that brings fewer returns to the caller, which
// waits again if need be.
func (c *shmConn) waitData(n int) error {
	r := c.in
	r.readerWaiting.Store(1)
	defer r.readerWaiting.Store(0)
	if avail, err := r.avail(); avail >= n || err != nil || r.closed.Load() != 0 || c.gone.Load() {
		return nil
	}
	return sleep(c.dataIn)
}

// CloseWrite tells the peer that this side writes no more: its reads
// return io.EOF once they have drained the ring.
func (c *shmConn) CloseWrite() error {
	if !c.acquire() {
		return net.ErrClosed
	}
	defer c.release()
	c.wclosed.Store(true)
	c.out.closed.Store(1)
	signal(c.dataOut)
	return nil
}

// Close ends both directions: waits in progress fail with net.ErrClosed,
// the peer sees this side gone, and the segment is unmapped once no Read
// or Write uses it.
func (c *shmConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.users++ // unmap in the release below, or in the last user's
	c.mu.Unlock()
	_ = c.ctl.Close()
	<-c.watchDone
	for _, f := range []*os.File{c.dataIn, c.spaceOut, c.dataOut, c.spaceIn} {
		_ = f.Close()
	}
	c.release()
	return nil
}

func (c *shmConn) LocalAddr() net.Addr  { return c.local }
func (c *shmConn) RemoteAddr() net.Addr { return c.remote }

func (c *shmConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// SetReadDeadline bounds waits for data; data already there is returned.
func (c *shmConn) SetReadDeadline(t time.Time) error { return c.dataIn.SetReadDeadline(t) }

// SetWriteDeadline bounds waits for space.
func (c *shmConn) SetWriteDeadline(t time.Time) error { return c.spaceOut.SetReadDeadline(t) }

// newSegment creates a segment with rings of ringBytes and its eventfds:
// the file descriptors a dialer sends, in shmFDs order, and the mapping.
func newSegment(ringBytes int) (fds []int, mem []byte, err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
			fds = nil
		}
	}()
	for range 4 {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return fds, nil, fmt.Errorf("eventfd: %w", err)
		}
		fds = append(fds, fd)
	}
	mfd, err := unix.MemfdCreate("tfdist-collective", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fds, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fds = append(fds, mfd)
	size := shmSegmentBytes(ringBytes)
	if err := unix.Ftruncate(mfd, int64(size)); err != nil {
		return fds, nil, fmt.Errorf("sizing the segment: %w", err)
	}
	// Sealed, so that neither side can shrink the segment under the other's
	// mapping (a SIGBUS) once it is sent.
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, shmSeals); err != nil {
		return fds, nil, fmt.Errorf("sealing the segment: %w", err)
	}
	mem, err = mapSegment(mfd, ringBytes)
	if err != nil {
		return fds, nil, err
	}
	initShmHeader(mem, ringBytes)
	return fds, mem, nil
}

// mapSegment maps a segment with rings of ringBytes (a multiple of the page
// size): its header page, then each ring twice in a row, so that a run of
// bytes that wraps around the ring's end is contiguous in memory. Pages are
// mapped in place (MAP_POPULATE), so that the first turns of the rings do
// not fault them in one by one. unmapSegment undoes it.
func mapSegment(fd, ringBytes int) ([]byte, error) {
	total := shmMappedBytes(ringBytes)
	base, err := unix.MmapPtr(-1, 0, nil, uintptr(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserving memory for the segment: %w", err)
	}
	type piece struct{ at, off, n int }
	pieces := []piece{{0, 0, shmHeaderBytes}}
	for d := range 2 {
		off, at := shmHeaderBytes+d*ringBytes, shmHeaderBytes+2*d*ringBytes
		pieces = append(pieces, piece{at, off, ringBytes}, piece{at + ringBytes, off, ringBytes})
	}
	for _, p := range pieces {
		_, err := unix.MmapPtr(fd, int64(p.off), unsafe.Add(base, p.at), uintptr(p.n),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_POPULATE)
		if err != nil {
			_ = unix.MunmapPtr(base, uintptr(total))
			return nil, fmt.Errorf("mapping the segment: %w", err)
		}
	}
	return unsafe.Slice((*byte)(base), total), nil
}

// unmapSegment unmaps what mapSegment mapped.
func unmapSegment(mem []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)))
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// dialShm connects to the acceptor's Unix socket name, sends it a new
// segment with nonce, and returns this side (the dialer's) of the
// connection. tcp is the connection the offer came on, whose addresses
// the new one keeps.
func dialShm(name string, nonce []byte, deadline time.Time, tcp net.Conn) (net.Conn, error) {
	d := net.Dialer{Deadline: deadline}
	uc, err := d.Dial("unix", name)
	if err != nil {
		return nil, err
	}
	fds, mem, err := newSegment(shmRingBytes)
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	publishMapping(mem, 0)
	rights := fds
	if a, _ := processArena(); a != nil {
		rights = append(rights[:shmFDs:shmFDs], a.fd)
	}
	_ = uc.SetDeadline(deadline)
	_, _, err = uc.(*net.UnixConn).WriteMsgUnix(nonce, unix.UnixRights(rights...), nil)
	closeFDs(fds[4:]) // the mapping stays; the acceptor maps its own copy
	var peerArena []byte
	var mapsMine bool
	if err == nil {
		peerArena, mapsMine, err = receiveArena(uc.(*net.UnixConn))
	}
	if err != nil {
		_ = uc.Close()
		_ = unmapSegment(mem)
		closeFDs(fds[:4])
		return nil, fmt.Errorf("sending the segment: %w", err)
	}
	_ = uc.SetDeadline(time.Time{})
	c := newShmConn(mem, [4]int(fds[:4]), 0, uc.(*net.UnixConn), tcp.LocalAddr(), tcp.RemoteAddr())
	c.peerArena, c.arenaBoth = peerArena, mapsMine && peerArena != nil
	return c, nil
}

// shmDelivery is a segment a dialer sent, as the acceptor received it,
// with the dialer's arena as mapped here (nil if none).
type shmDelivery struct {
	ctl       *net.UnixConn
	fds       []int
	peerArena []byte
}

// open maps the delivered segment and returns the acceptor's side.
func (d shmDelivery) open(tcp net.Conn) (net.Conn, error) {
	mfd := d.fds[4]
	defer func() { _ = unix.Close(mfd) }()
	var st unix.Stat_t
	if err := unix.Fstat(mfd, &st); err != nil {
		d.discard()
		return nil, fmt.Errorf("segment: %w", err)
	}
	ringBytes := (st.Size - shmHeaderBytes) / 2
	if st.Size < shmHeaderBytes || ringBytes <= 0 || ringBytes > shmMaxRingBytes || ringBytes%int64(os.Getpagesize()) != 0 ||
		st.Size != int64(shmSegmentBytes(int(ringBytes))) {
		d.discard()
		return nil, fmt.Errorf("segment of %d bytes", st.Size)
	}
	if seals, err := unix.FcntlInt(uintptr(mfd), unix.F_GET_SEALS, 0); err != nil || seals&shmSeals != shmSeals {
		d.discard()
		return nil, fmt.Errorf("segment not sealed (seals %#x, %v)", seals, err)
	}
	mem, err := mapSegment(mfd, int(ringBytes))
	if err == nil && !shmHeaderOK(mem) {
		_ = unmapSegment(mem)
		err = errors.New("segment header is not tfdist's")
	}
	if err != nil {
		d.discard()
		return nil, err
	}
	publishMapping(mem, 1)
	c := newShmConn(mem, [4]int(d.fds[:4]), 1, d.ctl, tcp.LocalAddr(), tcp.RemoteAddr())
	c.peerArena = d.peerArena
	return c, nil
}

// discard closes a delivery that is not used.
func (d shmDelivery) discard() {
	closeFDs(d.fds)
	if d.ctl != nil {
		_ = d.ctl.Close()
	}
	if d.peerArena != nil {
		_ = unix.Munmap(d.peerArena)
	}
}

// listenShm listens on a fresh abstract Unix socket, which exists in this
// network namespace only: a dialer on another host or in another
// container cannot reach it and stays on TCP.
func listenShm() (*net.UnixListener, error) {
	name := "@tfdist-collective-" + randomHex(16)
	return net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
}

// receiveShm reads a dialer's nonce and segment from uc within deadline.
func receiveShm(uc *net.UnixConn, deadline time.Time) (nonce []byte, d shmDelivery, err error) {
	_ = uc.SetReadDeadline(deadline)
	buf := make([]byte, shmNonceLen)
	oob := make([]byte, unix.CmsgSpace(4*(shmFDs+1)))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, d, err
	}
	if d.fds, err = receivedRights(oob[:oobn]); err != nil {
		return nil, d, err
	}
	if n != shmNonceLen || (len(d.fds) != shmFDs && len(d.fds) != shmFDs+1) {
		closeFDs(d.fds)
		return nil, shmDelivery{}, fmt.Errorf("got %d bytes and %d descriptors, want %d and %d or %d", n, len(d.fds), shmNonceLen, shmFDs, shmFDs+1)
	}
	if len(d.fds) > shmFDs {
		d.peerArena, _ = mapPeerArena(d.fds[shmFDs]) // without it, this link does not push
		_ = unix.Close(d.fds[shmFDs])
		d.fds = d.fds[:shmFDs]
	}
	_ = uc.SetDeadline(deadline)
	if err := sendArena(uc, d.peerArena != nil); err != nil {
		d.discard()
		return nil, shmDelivery{}, err
	}
	_ = uc.SetDeadline(time.Time{})
	d.ctl = uc
	return buf, d, nil
}

// receivedRights returns the file descriptors that the control messages
// oob of a received message carry.
func receivedRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds, nil
}
