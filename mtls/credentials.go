package mtls

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Credentials are a task's CA, certificate and key, read by Load. Each
// handshake first checks whether the files changed on disk and, if so,
// reads them again: a new certificate or CA takes effect for the next
// connection, while a reading that fails its checks is logged and the
// previous one kept. Safe for concurrent use.
type Credentials struct {
	files Files
	log   *zap.Logger

	mu    sync.Mutex
	cur   *material
	stamp [3]stamp
}

// stamp is what a reload compares: a file's modification time and size.
type stamp struct {
	mod  time.Time
	size int64
}

// LoadOption configures Load.
type LoadOption func(*Credentials)

// WithLogger logs reloads of the files (zap.NewNop by default).
func WithLogger(l *zap.Logger) LoadOption {
	return func(c *Credentials) {
		if l != nil {
			c.log = l
		}
	}
}

// Load reads and checks f: the CA file must hold CA certificates, the key
// must be the certificate's, and the certificate must be valid now, signed
// by the CA, meant for client and server authentication and name one task
// (see the package doc). Errors name the file and what is wrong.
func Load(f Files, opts ...LoadOption) (*Credentials, error) {
	c := &Credentials{files: f, log: zap.NewNop()}
	for _, o := range opts {
		o(c)
	}
	st := c.stat()
	m, err := loadMaterial(f, time.Now())
	if err != nil {
		return nil, err
	}
	c.cur, c.stamp = m, st
	return c, nil
}

// Files returns the files the credentials are read from.
func (c *Credentials) Files() Files { return c.files }

// Identity returns the task this task's certificate names.
func (c *Credentials) Identity() Identity { return c.current().id }

func (c *Credentials) stat() [3]stamp {
	var st [3]stamp
	for i, p := range []string{c.files.CA, c.files.Cert, c.files.Key} {
		if fi, err := os.Stat(p); err == nil {
			st[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return st
}

// current returns the credentials to use now, reading the files again if
// they changed.
func (c *Credentials) current() *material {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stat()
	if st == c.stamp {
		return c.cur
	}
	c.stamp = st
	m, err := loadMaterial(c.files, time.Now())
	switch {
	case err != nil:
		c.log.Warn("TLS files changed but cannot be used; keeping the previous ones", zap.Error(err))
	case m.id != c.cur.id:
		c.log.Warn("TLS certificate changed to another task; keeping the previous one",
			zap.Stringer("was", c.cur.id), zap.Stringer("now", m.id), zap.String("file", c.files.Cert))
	default:
		c.log.Info("TLS files reloaded", zap.String("certificate", c.files.Cert),
			zap.Time("not_after", m.cert.Leaf.NotAfter))
		c.cur = m
	}
	return c.cur
}

// Peer describes the certificate a peer presented, for the audit log.
type Peer struct {
	// Identity is the task the certificate names (zero if none).
	Identity Identity
	// Subject is the certificate's subject.
	Subject string
	// Fingerprint is the SHA-256 of the certificate, in hex.
	Fingerprint string
}

// Presented reports whether the peer presented a certificate.
func (p Peer) Presented() bool { return p.Fingerprint != "" }

// AuditFields returns the fields of an audit record that describe the
// certificate (none when the peer presented none): its SHA-256, subject
// and identity; never a key.
func (p Peer) AuditFields() []zap.Field {
	if !p.Presented() {
		return nil
	}
	fs := []zap.Field{zap.String("cert_sha256", p.Fingerprint), zap.String("cert_subject", p.Subject)}
	if p.Identity.Job != "" {
		fs = append(fs, zap.Stringer("cert_identity", p.Identity))
	}
	return fs
}

// PeerOf describes cert, a certificate a peer presented.
func PeerOf(cert *x509.Certificate) Peer {
	sum := sha256.Sum256(cert.Raw)
	p := Peer{Subject: cert.Subject.String(), Fingerprint: hex.EncodeToString(sum[:])}
	p.Identity, _ = IdentityOf(cert)
	return p
}

// LoadConfig is Load followed by Config: the TLS configuration of the
// task whose files f names.
func LoadConfig(f Files, opts ...LoadOption) (*tls.Config, error) {
	c, err := Load(f, opts...)
	if err != nil {
		return nil, err
	}
	return c.Config(), nil
}

// Config returns a TLS 1.3 configuration that presents the task's
// certificate and accepts a peer only if its certificate chains to the
// CA, is valid now, is meant for the side the peer plays and names a task
// of the same job (see the package doc). It serves both ends of a
// connection. A client (tls.Client) checks the server's certificate and,
// when the configuration's ServerName is set, that it names that task
// (cluster.Task's String, e.g. "worker:1"): set it on a clone for each
// connection, as net/http does with a host name. A server (tls.Server)
// requires the client's certificate; which task it must name is for the
// caller to check against what the client claims (PeerOf). In TLS 1.3
// the server checks the client's certificate after the client's handshake
// ends: a refusal shows as an error on the client's first read.
//
// Each handshake uses the credentials as they are then, reading the files
// again if they changed.
func (c *Credentials) Config() *tls.Config {
	cfg := baseConfig()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &c.current().cert, nil
	}
	cfg.InsecureSkipVerify = true // VerifyConnection checks the chain and the task instead of a host name
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return c.current().verifyPeer(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, cs.ServerName)
	}
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m := c.current()
		sc := baseConfig()
		sc.Certificates = []tls.Certificate{m.cert}
		sc.ClientAuth = tls.RequireAnyClientCert // VerifyConnection checks the chain and the job
		sc.VerifyConnection = func(cs tls.ConnectionState) error {
			return m.verifyPeer(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, "")
		}
		return sc, nil
	}
	return cfg
}

func baseConfig() *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		SessionTicketsDisabled:      true, // every connection shows its certificate
		DynamicRecordSizingDisabled: true, // full records from the first byte: the engine moves bulk data
	}
}

// verifyPeer checks the certificates a peer presented for usage and,
// unless want is empty, that they name the task want.
func (m *material) verifyPeer(certs []*x509.Certificate, usage x509.ExtKeyUsage, want string) error {
	if len(certs) == 0 {
		return errors.New("the peer presented no certificate")
	}
	leaf := certs[0]
	now := time.Now()
	if err := checkValidity(leaf, now); err != nil {
		return err
	}
	if err := verifyChain(leaf, certs[1:], m.pool, usage, now); err != nil {
		return err
	}
	id, err := IdentityOf(leaf)
	switch {
	case err != nil:
		return err
	case id.Job != m.id.Job:
		return fmt.Errorf("certificate names %s, a task of job %q; this task's job is %q", id.Task, id.Job, m.id.Job)
	case want != "" && id.Task.String() != want:
		return fmt.Errorf("certificate names %s; the cluster has %s at this address", id.Task, want)
	}
	return nil
}
