package multiworker

import (
	"crypto/tls"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/mtls"
)

// WithTLS secures the traffic between workers with TLS configured by cfg,
// which mtls.LoadConfig builds from a task's files: mutual TLS 1.3 (see
// package mtls), in which this worker presents its certificate, which
// must name its task, and accepts only peers whose certificates, signed
// by the job's CA, name the same job and the task the cluster puts at
// their address. Without it, New reads the files the environment names
// (TFDIST_TLS_CA, TFDIST_TLS_CERT, TFDIST_TLS_KEY). Only tfdist's engine
// can use TLS: with WithCommunication(Ring) or NCCL, TensorFlow's gRPC
// server carries the tensors in plaintext, and New logs a warning (or,
// with RequireTLS, fails).
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// RequireTLS makes New fail unless the traffic between workers is TLS: a
// cluster of several workers needs certificates (WithTLS or the
// environment) and tfdist's engine. TFDIST_REQUIRE_TLS=1 in the
// environment does the same.
func RequireTLS() Option { return func(c *config) { c.requireTLS = true } }

// security returns the TLS options of the engine's group (none without
// TLS), from tlsConfig.
func (c config) security(log *zap.Logger) ([]collective.Option, error) {
	cfg, err := c.tlsConfig(log)
	if cfg == nil || err != nil {
		return nil, err
	}
	return []collective.Option{collective.WithTLS(cfg)}, nil
}

// tlsConfig returns WithTLS's configuration or, without it, that of the
// certificate files the environment names, read and checked; nil for
// plaintext. It fails when TLS is required but not configured.
func (c config) tlsConfig(log *zap.Logger) (*tls.Config, error) {
	required, err := c.tlsRequired()
	if err != nil {
		return nil, err
	}
	cfg, creds, err := mtls.Resolve(c.tls, os.LookupEnv, mtls.WithLogger(log))
	switch {
	case err != nil:
		return nil, fmt.Errorf("multiworker: %w", err)
	case creds != nil:
		log.Info("traffic between workers is mutual TLS", zap.Stringer("identity", creds.Identity()),
			zap.String("certificate", creds.Files().Cert))
	case cfg != nil:
		log.Info("traffic between workers is mutual TLS")
	case required:
		return nil, fmt.Errorf("multiworker: TLS is required (RequireTLS or %s) but no certificate is configured: use WithTLS, or set %s, %s and %s",
			mtls.EnvRequire, mtls.EnvCA, mtls.EnvCert, mtls.EnvKey)
	}
	return cfg, nil
}

// checkPlaintext refuses, when TLS is required, a path that cannot use it,
// and warns when TLS is configured for one.
func (c config) checkPlaintext(log *zap.Logger) error {
	required, err := c.tlsRequired()
	if err != nil {
		return err
	}
	path := fmt.Sprintf("communication %s", c.comm)
	if err := mtls.RefuseUnencrypted(required, path); err != nil {
		return fmt.Errorf("multiworker: %w; tfdist's engine, the default communication, can use TLS", err)
	}
	files, _, err := mtls.FilesFromEnv(os.LookupEnv)
	if err != nil {
		return fmt.Errorf("multiworker: %w", err)
	}
	if c.tls != nil || !files.IsZero() {
		log.Warn("TLS certificates are configured but not used: the traffic between workers is plaintext",
			zap.String("why", path+" runs over TensorFlow's gRPC server, which takes no TLS in TensorFlow 2.18"))
	}
	return nil
}

// tlsRequired reports whether TLS is required, by the options or the
// environment.
func (c config) tlsRequired() (bool, error) {
	required, err := mtls.RequiredFromEnv(os.LookupEnv)
	if err != nil {
		return false, fmt.Errorf("multiworker: %w", err)
	}
	return required || c.requireTLS, nil
}
