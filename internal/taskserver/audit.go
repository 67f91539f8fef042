package taskserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/mtls"
)

// The audit trail: one record, on the logger named "audit", for every
// peer refused (a request, or under TLS a handshake), for every connection
// whose first request is admitted (joined) and for its end (left), and for
// every value a fragment refused (of the wrong dtype or shape). Each
// carries the peer's address and, under TLS, the fingerprint, subject and
// identity of the certificate it presented; never a key or a payload.

// peer is a connection's peer.
type peer struct {
	addr   string
	joined bool
	cert   mtls.Peer
}

type peerKey struct{}

func (s *Server) auditRefused(addr string, p mtls.Peer, reason string, more ...zap.Field) {
	fs := []zap.Field{zap.String("address", addr), zap.String("reason", reason), zap.Bool("tls", s.tls != nil)}
	fs = append(append(fs, more...), p.AuditFields()...)
	s.audit.Warn("peer refused", fs...)
}

// connContext tracks each connection's peer.
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	p := &peer{addr: c.RemoteAddr().String()}
	s.mu.Lock()
	s.peers[c] = p
	s.mu.Unlock()
	return context.WithValue(ctx, peerKey{}, p)
}

// connState records the end of a joined peer's connection.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	s.mu.Lock()
	p := s.peers[c]
	delete(s.peers, c)
	joined := p != nil && p.joined
	s.mu.Unlock()
	if joined {
		s.audit.Info("peer left", append([]zap.Field{zap.String("address", p.addr)}, p.cert.AuditFields()...)...)
	}
}

// admit checks a request: it refuses, with the reason, one of another job
// or protocol version, or with a certificate of another job, and one that
// expects another incarnation of the server.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) bool {
	cert := certificate(r)
	if status, reason := s.refusal(r, cert); reason != "" {
		s.auditRefused(r.RemoteAddr, cert, reason, zap.String("path", r.URL.Path), zap.String("job_claimed", r.Header.Get(headerJob)))
		s.reply(w, nil, status, &RefusedError{Reason: reason})
		return false
	}
	if want := r.Header.Get(headerExpect); want != "" && want != s.incarnation {
		s.reply(w, nil, http.StatusPreconditionFailed, fmt.Errorf("taskserver: %w: the client knew incarnation %s, this is %s; the request was not run",
			ErrRestarted, want, s.incarnation))
		return false
	}
	s.joined(r, cert)
	return true
}

// certificate returns the peer's certificate of r, if any.
func certificate(r *http.Request) mtls.Peer {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		return mtls.PeerOf(r.TLS.PeerCertificates[0])
	}
	return mtls.Peer{}
}

// auditValue records a value of r that a fragment refused (of another
// dtype or shape than its placeholder's), with the peer that sent it.
func (s *Server) auditValue(r *http.Request, err error) {
	var fe *partition.FeedError
	if !errors.As(err, &fe) {
		return
	}
	fs := []zap.Field{zap.String("address", r.RemoteAddr), zap.String("reason", fe.Error()), zap.Strings("variables", fe.Variables)}
	s.audit.Warn("value refused", append(fs, certificate(r).AuditFields()...)...)
}

// refusal returns why r is refused and the status that says so, or "".
func (s *Server) refusal(r *http.Request, cert mtls.Peer) (int, string) {
	switch got := r.Header.Get(headerProtocol); {
	case r.Method != http.MethodPost:
		return http.StatusMethodNotAllowed, fmt.Sprintf("method %s, expected POST", r.Method)
	case got != protocolVersion:
		return http.StatusConflict, fmt.Sprintf("protocol version %q; this server speaks version %q", got, protocolVersion)
	case r.Header.Get(headerJob) != s.cfg.job:
		return http.StatusConflict, fmt.Sprintf("job %q; this server serves job %q: the tasks' cluster specs differ", r.Header.Get(headerJob), s.cfg.job)
	case s.tls == nil:
		return 0, ""
	case !cert.Presented():
		return http.StatusForbidden, "no client certificate"
	case s.own.Job == "":
		return 0, ""
	case cert.Identity.Job == "":
		return http.StatusForbidden, fmt.Sprintf("certificate %q names no task", cert.Subject)
	case cert.Identity.Job != s.own.Job:
		return http.StatusForbidden, fmt.Sprintf("certificate names %s, a task of job %q; this server's job is %q",
			cert.Identity.Task, cert.Identity.Job, s.own.Job)
	}
	return 0, ""
}

// joined records the first admitted request of a connection.
func (s *Server) joined(r *http.Request, cert mtls.Peer) {
	p, _ := r.Context().Value(peerKey{}).(*peer)
	if p == nil {
		return
	}
	s.mu.Lock()
	first := !p.joined
	p.joined, p.cert = true, cert
	s.mu.Unlock()
	if first {
		s.audit.Info("peer joined", append([]zap.Field{zap.String("address", p.addr), zap.Bool("tls", s.tls != nil)}, cert.AuditFields()...)...)
	}
}

// auditing returns a clone of cfg whose handshakes write their refusals of
// a certificate to the audit log.
func (s *Server) auditing(cfg *tls.Config) *tls.Config {
	out := cfg.Clone()
	get := cfg.GetConfigForClient
	out.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		sc := cfg
		if get != nil {
			c, err := get(hi)
			if err != nil {
				return nil, err
			}
			if c != nil {
				sc = c
			}
		}
		sc = sc.Clone()
		sc.GetConfigForClient = nil
		if verify := sc.VerifyConnection; verify != nil {
			sc.VerifyConnection = func(cs tls.ConnectionState) error {
				err := verify(cs)
				if err != nil {
					s.auditHandshake(hi.Conn.RemoteAddr().String(), cs.PeerCertificates, err)
				}
				return err
			}
		}
		return sc, nil
	}
	return out
}

func (s *Server) auditHandshake(addr string, certs []*x509.Certificate, err error) {
	var p mtls.Peer
	if len(certs) > 0 {
		p = mtls.PeerOf(certs[0])
	}
	s.refused.Store(addr, true)
	s.auditRefused(addr, p, "TLS handshake: "+err.Error())
}

// errorLog takes net/http's error log: a failed TLS handshake that
// auditing did not record goes to the audit log, the rest to the logger.
type errorLog struct{ s *Server }

const handshakeLogPrefix = "http: TLS handshake error from "

func (l errorLog) Write(b []byte) (int, error) {
	msg := strings.TrimSpace(string(b))
	if rest, ok := strings.CutPrefix(msg, handshakeLogPrefix); ok {
		addr, reason, _ := strings.Cut(rest, ": ")
		if _, done := l.s.refused.LoadAndDelete(addr); !done {
			l.s.auditRefused(addr, mtls.Peer{}, "TLS handshake: "+reason)
		}
		return len(b), nil
	}
	l.s.log.Warn("taskserver: HTTP server", zap.String("error", msg))
	return len(b), nil
}

// ownIdentity returns the identity the certificate cfg presents names.
func ownIdentity(cfg *tls.Config) (mtls.Identity, error) {
	var cert *tls.Certificate
	switch {
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{Version: tls.VersionTLS13})
		if err != nil {
			return mtls.Identity{}, err
		}
		cert = c
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return mtls.Identity{}, errors.New("the configuration presents no certificate")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return mtls.Identity{}, err
		}
	}
	return mtls.IdentityOf(leaf)
}
