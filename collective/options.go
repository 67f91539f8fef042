package collective

import (
	"crypto/tls"
	"net"
	"time"

	"go.uber.org/zap"
)

// Default bounds and tuning of a group.
const (
	defaultTimeout        = 60 * time.Second
	defaultStartupTimeout = 120 * time.Second
	defaultHelloTimeout   = 10 * time.Second
	defaultLinger         = 2 * time.Second
	defaultChunkBytes     = 1 << 20
	defaultDirectMax      = 256 << 10
	defaultRingWindow     = 2
	defaultHangWarning    = 10 * time.Second
)

// Option configures New.
type Option func(*config)

type config struct {
	fingerprint    uint64
	epoch          uint32
	timeout        time.Duration
	startupTimeout time.Duration
	listener       net.Listener
	tlsConfig      *tls.Config
	sharedMemory   bool
	log            *zap.Logger
	observer       func(Record)
	hangWarning    time.Duration

	// Tuning, set by this package's tests.
	helloTimeout time.Duration         // bound on an accepted connection's hello
	linger       time.Duration         // bound on the orderly shutdown of a connection
	chunkBytes   int                   // largest payload of a data frame
	directMax    int                   // largest all-reduce that takes the direct path
	ringWindow   int                   // step-0 chunks a ring member sends before receiving
	remoteMin    int                   // smallest ring chunk sent as its address (remote.go); 0: none, and peers are not read
	pushMin      int                   // smallest all-reduce that announces (push.go); every member must have the same
	beforeRemote func(step, chunk int) // called before a chunk is read from a peer's memory
	beforePush   func(step, chunk int) // called before a chunk is written into a peer's result
}

func defaultConfig() config {
	return config{
		timeout:        defaultTimeout,
		startupTimeout: defaultStartupTimeout,
		sharedMemory:   true,
		log:            zap.NewNop(),
		hangWarning:    defaultHangWarning,
		helloTimeout:   defaultHelloTimeout,
		linger:         defaultLinger,
		chunkBytes:     defaultChunkBytes,
		directMax:      defaultDirectMax,
		ringWindow:     defaultRingWindow,
		remoteMin:      defaultRemoteMin,
		pushMin:        defaultPushMin,
	}
}

// WithFingerprint sets the group's identity, typically a hash of the cluster
// spec. A peer started with another fingerprint is refused and New fails.
func WithFingerprint(fp uint64) Option { return func(c *config) { c.fingerprint = fp } }

// WithEpoch sets the membership epoch (0 by default). It is carried in every
// frame; a peer of another epoch is refused.
func WithEpoch(e uint32) Option { return func(c *config) { c.epoch = e } }

// WithTimeout bounds every operation (60s by default). Zero means no bound
// other than the operation's context.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithStartupTimeout bounds how long New waits for every peer to connect
// (120s by default). Zero means no bound other than New's context.
func WithStartupTimeout(d time.Duration) Option { return func(c *config) { c.startupTimeout = d } }

// WithListener makes the group accept peers on l instead of listening on its
// member address. New takes ownership of l and closes it when the group ends.
func WithListener(l net.Listener) Option { return func(c *config) { c.listener = l } }

// WithTLS secures every connection of the group with TLS configured by
// cfg, which must present this member's certificate and verify the peer's
// at both ends (mutual TLS): mtls.LoadConfig builds such a configuration
// from a task's files. Each member's certificate must name it, as package
// mtls writes identities: New checks this member's own; a connection the
// group dials runs on a clone of cfg whose ServerName is the dialled
// member's Name, which cfg must check the peer's certificate names; and
// an accepted peer is taken only if its certificate names the member its
// hello claims to be. Every member of a group must use TLS, or none. cfg
// must not be modified afterwards.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tlsConfig = cfg } }

// WithSharedMemory sets whether members on one host move their frames to
// shared memory instead of loopback TCP (on by default, Linux only). The
// connection is set up and authenticated over TCP (and TLS) first; then
// both sides must agree, and a peer on another host or in another network
// namespace stays on TCP. Frames in shared memory are not encrypted: they
// never leave the host, and only the two processes map them.
func WithSharedMemory(on bool) Option { return func(c *config) { c.sharedMemory = on } }

// WithLogger sets the logger (zap.NewNop by default).
func WithLogger(l *zap.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}
