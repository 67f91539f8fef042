package collective

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"
)

// The shared-memory upgrade. Members on one host move their frames to a
// shared-memory segment instead of the loopback TCP connection, as MPI
// and NCCL do: a frame is copied twice in user space, and no system call
// or kernel copy is left on the data path. The connection starts as
// usual (TCP, TLS, hello), so the peer is authenticated first; then:
//
//  1. The acceptor's hello carries an offer: a random nonce and the name of
//     its abstract Unix socket, which only processes in its network
//     namespace can reach.
//  2. The dialer creates the segment and sends it with the nonce over that
//     socket (SCM_RIGHTS), then tells the acceptor on the TCP connection
//     whether it did (an upgrade frame, root 1 or 0). A dialer on another
//     host cannot reach the socket and answers 0.
//  3. The acceptor takes the segment that came with its nonce, registers
//     the peer, and acknowledges with an upgrade frame (or rejects). Both
//     sides then close the TCP connection; the Unix socket stays open, so
//     that each side learns when the other's process has gone.
//
// The nonce travels only on the authenticated connection, so no other
// local process can slip in a segment. Frames are the same on both
// transports, so a group may mix them.

// shmNonceLen is the length of an offer's nonce.
const shmNonceLen = 32

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startShm listens for the segments of the peers this member accepts,
// when the group uses shared memory.
func (g *Group) startShm() {
	if !g.cfg.sharedMemory || !shmSupported {
		return
	}
	a, err := processArena()
	if err != nil {
		g.log.Info("collective arena unavailable; peers on this host copy results out of each other's memory", zap.Error(err))
	}
	g.arena = a
	if g.rank == len(g.members)-1 {
		return
	}
	ln, err := listenShm()
	if err != nil {
		g.log.Info("collective shared memory unavailable; peers on this host use TCP", zap.Error(err))
		return
	}
	g.shmLn, g.offers = ln, make(map[string]chan shmDelivery)
	g.wg.Add(1)
	go g.acceptLoop(ln, func(nc net.Conn) { g.receiveSegment(nc.(*net.UnixConn)) })
}

// receiveSegment hands a dialer's segment to the offer its nonce names.
func (g *Group) receiveSegment(uc *net.UnixConn) {
	defer g.wg.Done()
	defer g.untrack(uc)
	nonce, d, err := receiveShm(uc, time.Now().Add(g.cfg.helloTimeout))
	if err == nil {
		if g.deliverSegment(string(nonce), d) {
			return
		}
		d.discard()
		err = errors.New("no offer has its nonce")
	}
	_ = uc.Close()
	g.log.Warn("collective refused a shared-memory segment", zap.Error(err))
}

// offerShm registers an offer and returns its nonce and the channel its
// segment comes on.
func (g *Group) offerShm() (string, chan shmDelivery) {
	nonce := randomHex(shmNonceLen / 2)
	ch := make(chan shmDelivery, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.offers[nonce] = ch
	return nonce, ch
}

// deliverSegment hands d to the pending offer of nonce, if any. The offer
// is removed and its channel filled under g.mu, so that withdrawShm either
// prevents the delivery or finds it.
func (g *Group) deliverSegment(nonce string, d shmDelivery) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := g.offers[nonce]
	if ch == nil {
		return false
	}
	delete(g.offers, nonce)
	ch <- d // buffered for this one delivery
	return true
}

// withdrawShm removes an offer and discards a segment that came but was
// not taken.
func (g *Group) withdrawShm(nonce string, ch chan shmDelivery) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.offers, nonce)
	select {
	case d := <-ch:
		d.discard()
	default:
	}
}

// acceptUpgrade runs the acceptor's side of the upgrade for the dialer on
// c, whose hello was accepted, and registers it on the transport they
// agree on.
func (g *Group) acceptUpgrade(c *peerConn, peer int, claimed string) {
	nonce, ch := g.offerShm()
	defer g.withdrawShm(nonce, ch)
	offer := append([]byte(nonce), g.shmLn.Addr().String()...)
	if err := c.writeRaw(g.hello(kindHello, string(offer)), g.cfg.helloTimeout); err != nil {
		g.refuse(c.nc, c.cert, "hello reply: "+err.Error())
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(g.cfg.helloTimeout))
	h, err := c.readHeader()
	if err == nil && h.kind != kindUpgrade {
		err = fmt.Errorf("%w: %d frame instead of the upgrade", errProtocol, h.kind)
	}
	if err != nil {
		g.reject(c, claimed, "upgrade: "+err.Error())
		return
	}
	joined := c
	if h.root == 1 {
		if joined, err = g.takeSegment(c, ch); err != nil {
			g.reject(c, claimed, "shared memory: "+err.Error())
			return
		}
		setArenaBoth(joined.nc, h.offset == 1)
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	ack := appendHeader(nil, &header{kind: kindUpgrade, epoch: g.cfg.epoch, root: 1})
	if !g.claimThenReply(c, joined, peer, claimed, ack) {
		if joined != c {
			_ = joined.nc.Close()
		}
		return
	}
	if joined != c {
		g.untrack(c.nc)
		_ = c.nc.Close()
	}
}

// takeSegment waits for the segment of ch and returns the connection over
// it, with c's peer identity.
func (g *Group) takeSegment(c *peerConn, ch chan shmDelivery) (*peerConn, error) {
	t := time.NewTimer(g.cfg.helloTimeout)
	defer t.Stop()
	select {
	case d := <-ch:
		sc, err := d.open(c.nc)
		if err != nil {
			return nil, err
		}
		probeShm(sc, g.cfg.remoteMin > 0) // the dialer published its mapping before it sent the segment
		return c.over(sc), nil
	case <-t.C:
		return nil, fmt.Errorf("no segment within %v", g.cfg.helloTimeout)
	case <-g.broken:
		return nil, g.Err()
	}
}

// over returns a connection to c's peer over nc, with c's identity.
func (c *peerConn) over(nc net.Conn) *peerConn {
	u := newPeerConn(nc)
	u.cert = c.cert
	return u
}

// dialUpgrade runs the dialer's side of the upgrade after the acceptor's
// hello offered it (payload of n bytes), and returns the connection to
// speak on.
func (g *Group) dialUpgrade(c *peerConn, peer int, n uint32) (*peerConn, error) {
	buf, err := c.readPayload(n)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the offer: %w", errRetry, err)
	}
	offer := string(*buf)
	putBuf(buf)
	var sc net.Conn
	if g.cfg.sharedMemory && shmSupported && len(offer) > shmNonceLen {
		sc, err = dialShm(offer[shmNonceLen:], []byte(offer[:shmNonceLen]), time.Now().Add(g.cfg.helloTimeout), c.nc)
		if err != nil {
			g.log.Debug("collective peer not reachable over shared memory; using TCP",
				zap.String("peer", g.members[peer].Name), zap.Error(err))
		}
	}
	answer := header{kind: kindUpgrade, epoch: g.cfg.epoch}
	if sc != nil {
		answer.root = 1
		answer.offset = uint64(btoi(arenaBoth(sc))) // both sides mapped the other's arena
	}
	if err = c.writeRaw(appendHeader(nil, &answer), g.cfg.helloTimeout); err == nil {
		err = g.readAck(c, peer)
	}
	switch {
	case err != nil && sc != nil:
		_ = sc.Close()
		return nil, err
	case err != nil:
		return nil, err
	case sc == nil:
		return c, nil
	}
	probeShm(sc, g.cfg.remoteMin > 0) // the acceptor published its mapping before it answered
	_ = c.nc.Close()
	return c.over(sc), nil
}

// readAck reads the acceptor's answer to the upgrade.
func (g *Group) readAck(c *peerConn, peer int) error {
	h, err := c.readHeader()
	if err != nil {
		return fmt.Errorf("%w: reading the upgrade reply: %w", errRetry, err)
	}
	switch h.kind {
	case kindUpgrade:
		return nil
	case kindReject:
		return g.rejected(c, peer, h.length)
	}
	return fmt.Errorf("%w: %w: %d frame instead of the upgrade reply", errRetry, errProtocol, h.kind)
}

// rejected returns the error for a reject of n bytes of reason from peer.
func (g *Group) rejected(c *peerConn, peer int, n uint32) error {
	reason, _ := c.readPayload(n)
	msg := ""
	if reason != nil {
		msg = string(*reason)
		putBuf(reason)
	}
	return fmt.Errorf("%w by %s: %s", errRetry, g.members[peer], msg)
}
