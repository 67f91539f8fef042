package collective

import (
	"bufio"
	"net"
	"sync"
)

// batchSize is how many bytes of TLS records batchedConn gathers into one
// write, and reads ahead in one read.
const batchSize = 256 << 10

// batchedConn sits between a TLS connection and its socket. TLS writes a
// frame as records of at most 16 KiB, each its own write, and reads one
// record per read: a system call per 16 KiB, which costs as much as the
// encryption itself. Once batching is on (after the handshake, whose
// messages go straight through), batchedConn gathers a frame's records
// into writes of up to batchSize until flush, and reads ahead.
type batchedConn struct {
	net.Conn
	r *bufio.Reader

	mu  sync.Mutex // TLS writes alerts and key updates from its read side too
	on  bool
	buf []byte
}

func newBatchedConn(nc net.Conn) *batchedConn {
	return &batchedConn{Conn: nc, r: bufio.NewReaderSize(nc, batchSize)}
}

func (b *batchedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *batchedConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= batchSize {
			return b.Conn.Write(p)
		}
	}
	if b.buf == nil {
		b.buf = make([]byte, 0, batchSize)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// batch turns batching on.
func (b *batchedConn) batch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = true
}

// passThrough sends what was gathered and turns batching off, before TLS
// closes its side: crypto/tls sends its close_notify and then sets the
// write deadline to now, so nothing gathered could be sent after it.
func (b *batchedConn) passThrough() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
	return b.flushLocked()
}

// flush writes what was gathered; nil b does nothing.
func (b *batchedConn) flush() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *batchedConn) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Close sends what was gathered (TLS's close_notify, say), within the
// write deadline in effect, and closes the socket.
func (b *batchedConn) Close() error {
	_ = b.flush()
	return b.Conn.Close()
}
