package elastic

import (
	"crypto/tls"
	"io"
	"slices"
	"time"

	"go.uber.org/zap"
)

// The defaults, which work together: a dead process is seen at once (its
// connection breaks), a silent host within the heartbeat timeout; the
// round timeout then bounds how long the first member to report waits for
// the others, which is longer than a heartbeat so that a member that is
// only slow is not dropped, and the wait timeout, far longer, is how long
// a job below its minimum waits for a replacement.
const (
	DefaultHeartbeat        = time.Second
	DefaultHeartbeatTimeout = 5 * time.Second
	DefaultRoundTimeout     = 10 * time.Second
	DefaultSettle           = 2 * time.Second
	DefaultWaitTimeout      = 5 * time.Minute
	DefaultFlapLimit        = 3
	DefaultFlapWindow       = 10 * time.Minute
)

// Option configures a Server.
type Option func(*serverConfig)

type serverConfig struct {
	job              string
	min, max         int
	sizes            []int // the memberships' allowed sizes, ascending; nil: min to max
	heartbeatTimeout time.Duration
	roundTimeout     time.Duration
	settle           time.Duration
	waitTimeout      time.Duration
	flapLimit        int
	flapWindow       time.Duration
	tls              *tls.Config
	log              *zap.Logger
	logTo            io.Writer  // the membership log
	replay           []LogEntry // the memberships to replay
	until            []int64    // the step each of replay's ends after
}

// WithJob names the job; a worker whose Hello names another is refused.
// Without it the first worker's job becomes the job's.
func WithJob(name string) Option { return func(c *serverConfig) { c.job = name } }

// WithMembers bounds the membership: a group forms with at least min
// workers and admits at most max.
func WithMembers(min, max int) Option { return func(c *serverConfig) { c.min, c.max = min, max } }

// WithSizes allows memberships of these sizes only (each between the
// minimum and the maximum), say 1, 2 and 4 for a job whose replica count
// must divide WithDeterministic's virtual shards: a group forms with the
// largest allowed size that its candidates reach, and the others wait as
// standbys.
func WithSizes(sizes ...int) Option { return func(c *serverConfig) { c.sizes = slices.Clone(sizes) } }

// WithHeartbeatTimeout sets how long a worker may stay silent before the
// server counts it as gone (a host down or cut off).
func WithHeartbeatTimeout(d time.Duration) Option {
	return func(c *serverConfig) { c.heartbeatTimeout = d }
}

// WithRoundTimeout sets how long, after a member reports for a new
// membership, the server waits for the other members before it drops
// those that have not reported.
func WithRoundTimeout(d time.Duration) Option { return func(c *serverConfig) { c.roundTimeout = d } }

// WithSettle sets how long the first group waits, with at least the
// minimum but fewer than the maximum, for further workers.
func WithSettle(d time.Duration) Option { return func(c *serverConfig) { c.settle = d } }

// WithWaitTimeout sets how long a job with fewer than its minimum waits
// for joiners, at the start and after losses, before it stops.
func WithWaitTimeout(d time.Duration) Option { return func(c *serverConfig) { c.waitTimeout = d } }

// WithFlapLimit refuses a worker that has left more than limit times
// within window.
func WithFlapLimit(limit int, window time.Duration) Option {
	return func(c *serverConfig) { c.flapLimit, c.flapWindow = limit, window }
}

// WithTLS serves over TLS with cfg, whose certificate must name
// mtls.RendezvousTask (see package mtls); workers then need Join's
// WithClientTLS. With mutual TLS, as mtls.LoadConfig configures it, a
// worker is admitted only if its certificate names the worker its Hello
// names.
func WithTLS(cfg *tls.Config) Option { return func(c *serverConfig) { c.tls = cfg } }

// WithLogger logs membership changes to l.
func WithLogger(l *zap.Logger) Option { return func(c *serverConfig) { c.log = l } }
