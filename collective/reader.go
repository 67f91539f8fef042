package collective

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// readLoop is the only reader of c: it demultiplexes frames into the
// operations' mailboxes and never blocks on an operation.
func (g *Group) readLoop(c *peerConn) {
	defer g.wg.Done()
	defer func() { _ = c.nc.Close() }()
	err := g.readFrames(c)
	if g.connDone(c, err) {
		// The peer left in order. Closing now would cut off the goodbye
		// this member sends when its own group ends, and the peer, still
		// draining, would take it for a lost connection.
		<-g.broken
		<-c.shut
	}
}

func (g *Group) readFrames(c *peerConn) error {
	for {
		h, err := c.readHeader()
		if err != nil {
			return err
		}
		if err := g.handleFrame(c, h); err != nil {
			return err
		}
	}
}

func (g *Group) handleFrame(c *peerConn, h header) error {
	if h.epoch != g.cfg.epoch {
		return fmt.Errorf("%w: frame of epoch %d, this member has %d", errProtocol, h.epoch, g.cfg.epoch)
	}
	switch h.kind {
	case kindData:
		if err := c.readPadding(h.length); err != nil {
			return err
		}
		if v := c.viewer; v != nil && h.length > 0 && int(h.length) <= v.viewMax() {
			p, err := v.view(int(h.length))
			if err != nil {
				return err
			}
			g.deliverInPlace(c.rank, h, p)
			v.consume(len(p))
			return nil
		}
		buf, err := c.readPayload(h.length)
		if err != nil {
			return err
		}
		g.deliver(c.rank, h, buf)
	case kindAbort:
		buf, err := c.readPayload(h.length)
		if err != nil {
			return err
		}
		var p []byte
		if buf != nil {
			p = *buf
		}
		g.fail(decodeAbort(c.member, p))
		if buf != nil {
			putBuf(buf)
		}
	case kindGoodbye:
		c.goodbye.Store(true)
	case kindClosing:
		g.peerClosing(c.rank)
	default:
		return fmt.Errorf("%w: unexpected %d frame", errProtocol, h.kind)
	}
	return nil
}

// connDone handles the end of c's stream: after a goodbye, EOF (or the
// drain bound) is an orderly close, and it returns true; anything else
// breaks the group.
func (g *Group) connDone(c *peerConn, err error) bool {
	orderly := errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded)
	if c.goodbye.Load() && orderly {
		g.auditLeft(c, nil)
		g.peerLeft(c.rank)
		return true
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: closed without a goodbye (%w)", ErrPeerLost, err)
	} else if !errors.Is(err, errProtocol) {
		err = fmt.Errorf("%w: %w", ErrPeerLost, err)
	}
	g.auditLeft(c, err)
	g.fail(g.peerError(c.rank, err))
	return false
}
