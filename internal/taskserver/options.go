package taskserver

import (
	"crypto/tls"
	"time"

	"go.uber.org/zap"
)

// DefaultTimeout bounds a request whose context has no deadline, and a
// dial, unless WithTimeout sets another bound.
const DefaultTimeout = time.Minute

// Option configures a Server or a Client.
type Option func(*config)

type config struct {
	tls     *tls.Config
	job     string
	log     *zap.Logger
	timeout time.Duration
	// serverName is the task a client expects its server's certificate to
	// name ("ps:0"), or "" for any task of the job.
	serverName string
}

func newConfig(opts []Option) config {
	c := config{log: zap.NewNop(), timeout: DefaultTimeout}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithTLS secures the connections with mutual TLS configured by cfg (nil:
// plaintext), which must present this task's certificate and verify the
// peer's at both ends, as mtls.LoadConfig's does; a server and its
// clients must both use TLS, or neither. cfg must not be modified
// afterwards.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithJob sets the identity of the job, the fingerprint of its cluster
// spec (cluster.ClusterSpec.Fingerprint's String): a server refuses the
// requests of another job, and a client's requests name it.
func WithJob(fingerprint string) Option { return func(c *config) { c.job = fingerprint } }

// WithLogger sets the logger (zap.NewNop by default); a server writes its
// audit trail to the logger's child named "audit".
func WithLogger(l *zap.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithTimeout bounds a request whose context has no deadline, a dial and
// a TLS handshake, and a server's reading of a request and writing of a
// response (DefaultTimeout if d is not positive).
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// withServerName makes a client check that its server's certificate names
// task (cluster.Task's String).
func withServerName(task string) Option { return func(c *config) { c.serverName = task } }
