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
	shm    bool // nc is a shared-memory connection
	br     *bufio.Reader
	hbuf   []byte   // the reader's header scratch
	dims   []uint64 // the reader's shape scratch

	wmu      sync.Mutex
	wdl      time.Time // write deadline in effect (under wmu)
	partial  bool      // a frame was cut short; the stream is unusable (under wmu)
	stopping atomic.Bool
	goodbye  atomic.Bool   // the peer announced an orderly close
	shut     chan struct{} // closed when shutdown has sent its final frame
}

func newPeerConn(nc net.Conn) *peerConn {
	return &peerConn{
		rank: -1,
		nc:   nc,
		br:   bufio.NewReaderSize(nc, 64<<10),
		hbuf: make([]byte, fixedLen+maxNameLen+8*maxRank),
		dims: make([]uint64, 0, maxRank),
		shut: make(chan struct{}),
	}
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

// write sends the frame in bufs (header, payload) whole, with writev.
func (c *peerConn) write(deadline time.Time, bufs *net.Buffers) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !deadline.Equal(c.wdl) {
		if err := c.nc.SetWriteDeadline(deadline); err != nil {
			return err
		}
		c.wdl = deadline
	}
	if c.stopping.Load() || c.partial {
		return errStopping
	}
	if _, err := bufs.WriteTo(c.nc); err != nil {
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
