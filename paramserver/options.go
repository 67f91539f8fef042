package paramserver

import (
	"crypto/tls"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/strategy"
)

// Option configures New and Serve.
type Option func(*config)

type config struct {
	log            *zap.Logger
	startupTimeout time.Duration
	opTimeout      time.Duration
	stepTimeout    time.Duration
	partitioner    strategy.Partitioner
	intra, inter   int
	tls            *tls.Config
}

func newConfig(opts []Option) config {
	c := config{startupTimeout: 2 * time.Minute, opTimeout: 2 * time.Minute, stepTimeout: 5 * time.Minute}
	for _, o := range opts {
		o(&c)
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	return c
}

// WithLogger sets the logger (default: none). Lines carry the task type and
// index, and the worker a step ran on.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// WithStartupTimeout bounds how long New waits for every ps and worker task
// to accept connections (default 2 minutes). A task that is not up by then
// is an error that names it.
func WithStartupTimeout(d time.Duration) Option { return func(c *config) { c.startupTimeout = d } }

// WithOperationTimeout bounds every operation the chief runs against the ps
// tasks itself — initialising variables, reading them, checkpoints
// (default 2 minutes).
func WithOperationTimeout(d time.Duration) Option { return func(c *config) { c.opTimeout = d } }

// WithStepTimeout bounds one run of a scheduled step on a worker (default 5
// minutes). A step that takes longer is treated as if its worker had died:
// the worker is probed and the step retried elsewhere.
func WithStepTimeout(d time.Duration) Option { return func(c *config) { c.stepTimeout = d } }

// WithPartitioner sets the partitioner of every variable created without
// one of its own (default: none, every variable in one piece).
func WithPartitioner(p strategy.Partitioner) Option { return func(c *config) { c.partitioner = p } }

// WithThreads sets the intra-op and inter-op thread pools of the servers
// this package starts (0: TensorFlow's default).
func WithThreads(intraOp, interOp int) Option {
	return func(c *config) { c.intra, c.inter = intraOp, interOp }
}

// WithTLS secures the traffic between the tasks — variables, gradients,
// steps — with TLS configured by cfg, which mtls.LoadConfig builds from a
// task's files: mutual TLS 1.3 (see package mtls), in which every task
// presents a certificate of the job. Without it, the certificate files the
// environment names (TFDIST_TLS_CA, TFDIST_TLS_CERT, TFDIST_TLS_KEY) are
// used, if any; TFDIST_REQUIRE_TLS=1 makes a task without one fail.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }
