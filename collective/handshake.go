package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/mtls"
)

// acceptLoop accepts connections on ln until it closes. Each is handled
// by handle in its own goroutine, so a slow client never blocks it.
func (g *Group) acceptLoop(ln net.Listener, handle func(net.Conn)) {
	defer g.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if g.acceptFailed(err) {
				return
			}
			continue
		}
		if !g.track(nc) {
			_ = nc.Close()
			return
		}
		g.wg.Add(1)
		go handle(nc)
	}
}

// acceptFailed reports whether the accept loop must stop; it pauses
// briefly on other errors (e.g. too many open files).
func (g *Group) acceptFailed(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	g.log.Warn("collective accept failed", zap.Error(err))
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-g.broken:
		return true
	case <-t.C:
		return false
	}
}

// track records an accepted connection whose hello is pending, so that a
// shutdown closes it; false if the group is shutting down.
func (g *Group) track(nc net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handshakes == nil {
		return false
	}
	g.handshakes[nc] = struct{}{}
	return true
}

func (g *Group) untrack(nc net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.handshakes, nc)
}

// handleAccepted runs the acceptor's side of the TLS handshake, when the
// group uses TLS, and of the hello exchange.
func (g *Group) handleAccepted(nc net.Conn) {
	defer g.wg.Done()
	if !g.memberHost(nc.RemoteAddr()) {
		g.refuse(nc, mtls.Peer{}, "connection from a host that is not a member's")
		return
	}
	sc, err := g.secureAccepted(nc)
	if err != nil {
		g.refuse(nc, sc.cert, err.Error())
		return
	}
	if sc.conn != nc {
		g.untrack(nc)
		if !g.track(sc.conn) {
			_ = sc.conn.Close()
			return
		}
	}
	c := sc.newPeerConn()
	_ = c.nc.SetReadDeadline(time.Now().Add(g.cfg.helloTimeout))
	h, err := c.readHeader()
	if err == nil && h.kind != kindHello {
		err = fmt.Errorf("%w: %d frame before hello", errProtocol, h.kind)
	}
	if err != nil {
		g.refuse(c.nc, c.cert, "does not speak the protocol: "+err.Error())
		return
	}
	g.acceptHello(c, &h)
}

// refuse closes an accepted connection before its hello, with an audit
// record.
func (g *Group) refuse(nc net.Conn, cert mtls.Peer, reason string) {
	g.auditRefused(nc.RemoteAddr(), "", cert, reason)
	g.untrack(nc)
	_ = nc.Close()
}

// acceptHello answers a dialer's hello: a hello back when it is a missing
// member of this group, a reject otherwise.
func (g *Group) acceptHello(c *peerConn, h *header) {
	peer := int(h.root)
	if fatal, err := g.checkHello(h, -1); err != nil {
		g.reject(c, "", err.Error())
		g.setupFailed(-1, err, fatal)
		return
	}
	claimed := g.members[peer].Name
	if err := g.checkClaim(c, peer); err != nil {
		g.reject(c, claimed, err.Error())
		return
	}
	if peer <= g.rank {
		g.reject(c, claimed, fmt.Sprintf("rank %d must not dial rank %d", peer, g.rank))
		return
	}
	if !g.claimable(peer) {
		g.reject(c, claimed, errClaimed)
		return
	}
	if g.shmLn != nil {
		g.acceptUpgrade(c, peer, claimed)
		return
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	g.claimThenReply(c, c, peer, claimed, g.hello(kindHello, ""))
}

// claimThenReply registers joined as the connection to peer and sends
// reply, the end of the handshake, on c. It holds c's write lock across
// both, so that no frame of an operation the registration lets start can
// precede the reply on c. If the claim fails, the dialer is rejected.
func (g *Group) claimThenReply(c, joined *peerConn, peer int, claimed string, reply []byte) bool {
	c.wmu.Lock()
	if !g.claim(peer, joined) {
		c.wmu.Unlock()
		g.reject(c, claimed, errClaimed)
		return false
	}
	err := c.writeRawLocked(reply, g.cfg.helloTimeout)
	c.wmu.Unlock()
	if err != nil {
		g.log.Warn("collective hello reply failed", zap.String("peer", claimed), zap.Error(err))
	}
	return true
}

// reject refuses a hello: the dialler learns why, and the audit trail too.
func (g *Group) reject(c *peerConn, claimed, reason string) {
	g.auditRefused(c.nc.RemoteAddr(), claimed, c.cert, reason)
	_ = c.writeRaw(g.hello(kindReject, reason), time.Second)
	g.untrack(c.nc)
	_ = c.nc.Close()
}

// hello encodes this member's hello (or reject with reason).
func (g *Group) hello(kind frameKind, reason string) []byte {
	h := header{kind: kind, epoch: g.cfg.epoch, seq: g.cfg.fingerprint,
		root: uint32(g.rank), count: uint64(len(g.members)), length: uint32(len(reason))}
	return append(appendHeader(nil, &h), reason...)
}

// checkHello checks a peer's hello (or reject) against this member. want is
// the rank expected to answer, or -1. fatal reports an error no retry fixes.
func (g *Group) checkHello(h *header, want int) (fatal bool, err error) {
	who := fmt.Sprintf("the member of rank %d", h.root)
	if int(h.root) < len(g.members) {
		who = g.members[h.root].String()
	}
	switch {
	case h.seq != g.cfg.fingerprint:
		return true, fmt.Errorf("collective: %s was started with a different cluster (fingerprint %#x, this member has %#x)",
			who, h.seq, g.cfg.fingerprint)
	case h.epoch != g.cfg.epoch:
		return true, fmt.Errorf("collective: %s was started with membership epoch %d, this member has %d",
			who, h.epoch, g.cfg.epoch)
	case h.count != uint64(len(g.members)):
		return true, fmt.Errorf("collective: %s was started with a group of %d, this member has %d",
			who, h.count, len(g.members))
	case int(h.root) >= len(g.members) || (want >= 0 && int(h.root) != want):
		return false, fmt.Errorf("collective: %s answered as rank %d", who, h.root)
	}
	return false, nil
}

// memberHost reports whether addr's IP belongs to a member's host, resolving
// the members' host names again if it is not known yet.
func (g *Group) memberHost(addr net.Addr) bool {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	g.hostMu.Lock()
	defer g.hostMu.Unlock()
	if g.hostIPs[ip] {
		return true
	}
	g.resolveHosts()
	return g.hostIPs[ip]
}

// resolveHosts adds the IPs of every member's host. Caller holds hostMu.
func (g *Group) resolveHosts() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, m := range g.members {
		host, _, _ := net.SplitHostPort(m.Addr)
		if host == "" {
			host = "localhost"
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			g.hostIPs[ip.Unmap()] = true
			continue
		}
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			g.log.Debug("collective could not resolve a member host", zap.String("host", host), zap.Error(err))
		}
		for _, ip := range ips {
			g.hostIPs[ip.Unmap()] = true
		}
	}
}
