package collective

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfdist/tfdist/mtls"
)

// errStopping fails a write on a connection that is shutting down.
var errStopping = errors.New("connection shutting down")

// peerConn is the transport to one peer: one reader goroutine owns the read
// side; writers send whole frames under wmu. Under TLS, nc is the TLS
// connection.
type peerConn struct {
	rank   int
	member Member
	cert   mtls.Peer    // the certificate the peer presented, under TLS
	batch  *batchedConn // under TLS, gathers a frame's records
	nc     net.Conn
	br     io.Reader
	viewer viewer    // nc, when it is a shared-memory connection, whose reader sees incoming bytes in place
	remote remoteMem // nc, when it is a shared-memory connection (see remote.go)
	push   pusher    // nc, when it is a shared-memory connection (see push.go)
	hbuf   []byte    // the reader's header scratch
	dims   []uint64  // the reader's shape scratch

	wmu      sync.Mutex
	wdl      time.Time   // write deadline in effect (under wmu)
	wvec     [3][]byte   // a frame's pieces (under wmu)
	wbufs    net.Buffers // wvec as writev takes it (under wmu)
	partial  bool        // a frame was cut short; the stream is unusable (under wmu)
	stopping atomic.Bool
	goodbye  atomic.Bool   // the peer announced an orderly close
	shut     chan struct{} // closed when shutdown has sent its final frame
}

// viewer is a connection whose reader can see incoming bytes in place:
// the shared-memory connection.
type viewer interface {
	// view waits until n bytes (at most viewMax) have arrived and returns
	// them without consuming them.
	view(n int) ([]byte, error)
	// consume frees the bytes of a view that returned no error.
	consume(n int)
	viewMax() int
	// readPad returns the bytes from the read position to the next
	// multiple of payloadAlign; writePad those from after bytes past the
	// write position.
	readPad() int
	writePad(after int) int
}

// payloadAlign is the alignment of payloads over connections that show
// frames in place: enough for every element type.
const payloadAlign = 8

// padTo returns the bytes from pos to the next multiple of payloadAlign.
func padTo(pos uint64) int { return int(-pos % payloadAlign) }

// readPadding skips the padding before a data frame's payload of n bytes
// over a connection that shows frames in place (see write).
func (c *peerConn) readPadding(n uint32) error {
	if c.viewer == nil || n == 0 {
		return nil
	}
	_, err := io.ReadFull(c.br, c.hbuf[:c.viewer.readPad()])
	return err
}

func newPeerConn(nc net.Conn) *peerConn {
	c := &peerConn{
		rank: -1,
		nc:   nc,
		hbuf: make([]byte, fixedLen+maxNameLen+8*maxRank),
		dims: make([]uint64, 0, maxRank),
		shut: make(chan struct{}),
	}
	c.remote, _ = nc.(remoteMem)
	c.push, _ = nc.(pusher)
	if v, ok := nc.(viewer); ok {
		c.br, c.viewer = nc, v // reads are copies from memory: no buffer to save calls
	} else {
		c.br = bufio.NewReaderSize(nc, 64<<10)
	}
	return c
}

// readHeader reads the next frame header. The name and shape alias the
// connection's scratch and are valid until the next call.
func (c *peerConn) readHeader() (header, error) {
	if _, err := io.ReadFull(c.br, c.hbuf[:fixedLen]); err != nil {
		return header{}, err
	}
	h, nameLen, rank, err := parseFixed(c.hbuf)
	if err != nil {
		return h, err
	}
	rest := c.hbuf[fixedLen : fixedLen+nameLen+8*rank]
	if _, err := io.ReadFull(c.br, rest); err != nil {
		return h, err
	}
	h.name = rest[:nameLen]
	if rank > 0 {
		h.dims = decodeDims(rest[nameLen:], c.dims[:0])
	}
	return h, nil
}

// readPayload reads a frame's payload into a pooled buffer (nil if empty).
func (c *peerConn) readPayload(n uint32) (*[]byte, error) {
	if n == 0 {
		return nil, nil
	}
	b := getBuf(int(n))
	if _, err := io.ReadFull(c.br, *b); err != nil {
		putBuf(b)
		return nil, err
	}
	return b, nil
}

// padding is zeros to align payloads with (see write).
var padding [payloadAlign]byte

// write sends a frame, its header and payload, whole, with writev. Over a
// connection that shows frames in place, a data frame's payload (when not
// empty) starts at a multiple of payloadAlign bytes of the stream: padding
// follows the header as needed, which the reader skips (see
// readPadding), so that the payload can be used where it lies.
func (c *peerConn) write(deadline time.Time, hdr, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wvec[0], c.wvec[1], c.wvec[2] = hdr, nil, payload
	if c.viewer != nil && len(payload) > 0 {
		c.wvec[1] = padding[:c.viewer.writePad(len(hdr))]
	}
	c.wbufs = c.wvec[:]
	defer func() { c.wvec = [3][]byte{} }()
	if !deadline.Equal(c.wdl) {
		if err := c.nc.SetWriteDeadline(deadline); err != nil {
			return err
		}
		c.wdl = deadline
	}
	if c.stopping.Load() || c.partial {
		return errStopping
	}
	if _, err := c.wbufs.WriteTo(c.nc); err != nil {
		c.partial = true
		return err
	}
	if err := c.batch.flush(); err != nil {
		c.partial = true
		return err
	}
	return nil
}

// writeRaw sends one encoded frame, bounded by d.
func (c *peerConn) writeRaw(frame []byte, d time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeRawLocked(frame, d)
}

// writeRawLocked is writeRaw for a caller that holds c.wmu.
func (c *peerConn) writeRawLocked(frame []byte, d time.Duration) error {
	c.wdl = time.Now().Add(d)
	if err := c.nc.SetWriteDeadline(c.wdl); err != nil {
		return err
	}
	if _, err := c.nc.Write(frame); err != nil {
		return err
	}
	return c.batch.flush()
}

// shutdown sends final (abort or goodbye) unless the stream is cut, then
// half-closes and bounds the reader's drain to EOF by linger. A writer
// blocked on a peer that does not read gives up within linger.
func (c *peerConn) shutdown(final []byte, linger time.Duration) {
	deadline := time.Now().Add(linger)
	c.stopping.Store(true)
	_ = c.nc.SetWriteDeadline(deadline)
	c.wmu.Lock()
	if !c.partial && final != nil {
		_ = c.nc.SetWriteDeadline(deadline)
		_, _ = c.nc.Write(final)
	}
	if c.batch != nil {
		_ = c.batch.passThrough()
	}
	closeWrite(c.nc)
	c.wmu.Unlock()
	_ = c.nc.SetReadDeadline(deadline)
	close(c.shut)
}

// closeWrite half-closes nc if it supports it, else closes it.
func closeWrite(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = nc.Close()
}
