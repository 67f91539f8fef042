package collective

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/mtls"
)

// The audit trail: one record, on the logger named "audit", for every
// peer that joins, leaves or is refused. Each carries the peer's address,
// the task it claims and, under TLS, the fingerprint and subject of the
// certificate it presented; never a key or a payload.

// auditRefused records a refused connection.
func (g *Group) auditRefused(remote net.Addr, claimed string, p mtls.Peer, reason string) {
	fs := []zap.Field{zap.String("address", remote.String()), zap.String("reason", reason), zap.Bool("tls", g.cfg.tlsConfig != nil)}
	if claimed != "" {
		fs = append(fs, zap.String("task_claimed", claimed))
	}
	g.audit.Warn("peer refused", append(fs, p.AuditFields()...)...)
}

// auditJoined records a peer that joined the group.
func (g *Group) auditJoined(c *peerConn) {
	fs := []zap.Field{zap.String("address", c.nc.RemoteAddr().String()), zap.String("task", c.member.Name),
		zap.Bool("tls", g.cfg.tlsConfig != nil), zap.Bool("shared_memory", c.viewer != nil),
		zap.Bool("reads_peer_memory", c.remote != nil && c.remote.canRead())}
	g.audit.Info("peer joined", append(fs, c.cert.AuditFields()...)...)
}

// auditLeft records a peer whose connection ended, in order (err nil) or not.
func (g *Group) auditLeft(c *peerConn, err error) {
	fs := []zap.Field{zap.String("address", c.nc.RemoteAddr().String()), zap.String("task", c.member.Name)}
	fs = append(fs, c.cert.AuditFields()...)
	if err != nil {
		g.audit.Warn("peer lost", append(fs, zap.Error(err))...)
		return
	}
	g.audit.Info("peer left", fs...)
}

// secured is a connection after the TLS handshake, if any.
type secured struct {
	conn  net.Conn     // the connection to speak on
	batch *batchedConn // under conn, with TLS
	cert  mtls.Peer    // what the peer presented
}

// newPeerConn returns the peer connection over s.
func (s secured) newPeerConn() *peerConn {
	c := newPeerConn(s.conn)
	c.batch, c.cert = s.batch, s.cert
	return c
}

// secureDialed runs the client side of the TLS handshake with peer on nc,
// when the group uses TLS.
func (g *Group) secureDialed(ctx context.Context, nc net.Conn, peer int) (secured, error) {
	sc, err := g.secure(ctx, nc, func(c net.Conn) *tls.Conn {
		cfg := g.cfg.tlsConfig.Clone()
		cfg.ServerName = g.members[peer].Name
		return tls.Client(c, cfg)
	})
	if err != nil {
		g.auditRefused(nc.RemoteAddr(), g.members[peer].Name, sc.cert, err.Error())
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w (it closed the connection during the TLS handshake: does it run without TLS?)", err)
		}
		return sc, fmt.Errorf("%w: %w", errRetry, err)
	}
	return sc, nil
}

// secureAccepted runs the server side of the TLS handshake on an accepted
// nc, when the group uses TLS.
func (g *Group) secureAccepted(nc net.Conn) (secured, error) {
	return g.secure(context.Background(), nc, func(c net.Conn) *tls.Conn { return tls.Server(c, g.cfg.tlsConfig) })
}

// secure runs the TLS handshake of the connection newConn makes of nc,
// over a batchedConn and within the hello timeout, when the group uses
// TLS; on failure the result holds only what the peer presented.
func (g *Group) secure(ctx context.Context, nc net.Conn, newConn func(net.Conn) *tls.Conn) (secured, error) {
	if g.cfg.tlsConfig == nil {
		return secured{conn: nc}, nil
	}
	hctx, cancel := context.WithTimeout(ctx, g.cfg.helloTimeout)
	defer cancel()
	bc := newBatchedConn(nc)
	tc := newConn(bc)
	err := tc.HandshakeContext(hctx)
	var p mtls.Peer
	if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
		p = mtls.PeerOf(certs[0])
	}
	if err != nil {
		return secured{cert: p}, fmt.Errorf("TLS handshake: %w", err)
	}
	bc.batch()
	return secured{conn: tc, batch: bc, cert: p}, nil
}

// checkOwnIdentity checks that the certificate cfg presents names this
// member.
func checkOwnIdentity(cfg *tls.Config, members []Member, rank int) error {
	id, err := mtls.ConfigIdentity(cfg)
	if err != nil {
		return fmt.Errorf("collective: WithTLS: this member's certificate: %w", err)
	}
	name := id.Task.String()
	if name == members[rank].Name {
		return nil
	}
	for _, m := range members {
		if m.Name == name {
			return fmt.Errorf("collective: this member's certificate names %s, but this member is %s", id, members[rank].Name)
		}
	}
	return fmt.Errorf("collective: this member's certificate names %s, which is not a member of the group", id)
}

// checkClaim checks that the certificate a dialler presented names the
// member its hello claims to be.
func (g *Group) checkClaim(c *peerConn, rank int) error {
	if g.cfg.tlsConfig == nil {
		return nil
	}
	if got := c.cert.Identity.Task.String(); got != g.members[rank].Name {
		return fmt.Errorf("certificate names %s, but the hello claims %s", c.cert.Identity, g.members[rank].Name)
	}
	return nil
}
