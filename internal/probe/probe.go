// Package probe checks that an address accepts connections, as the
// parameter-server coordinator's heartbeat, the diagnosis of a failed step
// and the wait for a cluster's tasks do; Server does so for a TensorFlow
// server without leaving a socket open on it.
//
// A TensorFlow server speaks gRPC over HTTP/2. A client that connects and
// closes at once, sending nothing, leaves the server's end of the
// connection open until gRPC's handshake deadline, 120 s later, so a
// probe every half second keeps some 240 sockets open on the server.
// Server instead ends the connection as an HTTP/2 client that is done
// with it would, and the server lets it go at once.
package probe

import (
	"context"
	"errors"
	"net"
)

// goodbye is what Server sends before it closes: the HTTP/2 client
// connection preface (RFC 9113, section 3.4), an empty SETTINGS frame,
// which the preface must be followed by, and a GOAWAY frame (last stream
// 0, NO_ERROR). A frame is a 9-byte header (24-bit length, type, flags,
// 31-bit stream) and its payload.
var goodbye = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
	"\x00\x00\x00" + "\x04" + "\x00" + "\x00\x00\x00\x00" + // SETTINGS, no parameters
	"\x00\x00\x08" + "\x07" + "\x00" + "\x00\x00\x00\x00" + // GOAWAY, 8 bytes:
	"\x00\x00\x00\x00" + "\x00\x00\x00\x00") // last stream 0, NO_ERROR

// Server connects to the TensorFlow server at addr (host:port) within ctx
// and closes the connection as described in the package doc. It returns
// nil when the server accepted the connection and took the goodbye.
func Server(ctx context.Context, addr string) error { return connect(ctx, addr, goodbye) }

// Port reports whether addr (host:port) accepts TCP connections within
// ctx, closing the connection at once: for listeners that are not gRPC's.
func Port(ctx context.Context, addr string) error { return connect(ctx, addr, nil) }

// connect dials addr within ctx, writes last (if any) and closes.
func connect(ctx context.Context, addr string, last []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	if len(last) > 0 {
		if deadline, ok := ctx.Deadline(); ok {
			_ = c.SetWriteDeadline(deadline)
		}
		_, err = c.Write(last)
	}
	return errors.Join(err, c.Close())
}
