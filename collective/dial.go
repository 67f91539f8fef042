package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// dialLoop connects to peer, retrying with backoff until ctx ends.
func (g *Group) dialLoop(ctx context.Context, peer int) {
	defer g.wg.Done()
	backoff := 20 * time.Millisecond
	for {
		c, err := g.dialOnce(ctx, peer)
		if err == nil {
			if !g.claim(peer, c) {
				_ = c.nc.Close()
			}
			return
		}
		fatal := !errors.Is(err, errRetry)
		g.setupFailed(peer, err, fatal)
		if fatal || !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dialOnce connects to peer and exchanges hellos. Errors wrap errRetry
// unless retrying cannot help.
func (g *Group) dialOnce(ctx context.Context, peer int) (*peerConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", g.members[peer].Addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRetry, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	var c *peerConn
	sc, err := g.secureDialed(ctx, nc, peer)
	if err == nil {
		c, err = g.greet(sc, peer)
	}
	if !stop() {
		err = errors.Join(err, fmt.Errorf("%w: %w", errRetry, ctx.Err()))
	}
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

// greet sends this member's hello on sc and checks the answer.
func (g *Group) greet(sc secured, peer int) (*peerConn, error) {
	c := sc.newPeerConn()
	nc := c.nc
	_ = nc.SetDeadline(time.Now().Add(g.cfg.helloTimeout))
	if err := c.writeRaw(g.hello(kindHello, ""), g.cfg.helloTimeout); err != nil {
		return nil, fmt.Errorf("%w: sending hello: %w", errRetry, err)
	}
	h, err := c.readHeader()
	if err != nil {
		if errors.Is(err, io.EOF) && g.cfg.tlsConfig == nil {
			err = fmt.Errorf("%w (it closed the connection without answering: does it require TLS, which this member does not use?)", err)
		}
		return nil, fmt.Errorf("%w: reading hello: %w", errRetry, err)
	}
	if fatal, err := g.checkHello(&h, peer); err != nil {
		if !fatal {
			err = fmt.Errorf("%w: %w", errRetry, err)
		}
		return nil, err
	}
	if h.kind == kindReject {
		return nil, g.rejected(c, peer, h.length)
	}
	if h.kind != kindHello {
		return nil, fmt.Errorf("%w: %w: %d frame instead of hello", errRetry, errProtocol, h.kind)
	}
	if h.length > 0 {
		if c, err = g.dialUpgrade(c, peer, h.length); err != nil {
			return nil, err
		}
	}
	_ = c.nc.SetDeadline(time.Time{})
	return c, nil
}
