package elastic

import (
	"context"
	"fmt"
	"os"

	"github.com/tfdist/tfdist/mtls"
)

// The environment `tfdist launch --elastic` gives each worker.
const (
	EnvRendezvous = "TFDIST_RENDEZVOUS" // the rendezvous's host:port
	EnvJob        = "TFDIST_JOB"        // the job's name
	EnvName       = "TFDIST_WORKER"     // the worker's name, e.g. "worker:3"
	// EnvHost is the address other workers reach this one at, where
	// 127.0.0.1 will not do (a pod's IP); read by distribute.Run.
	EnvHost = "TFDIST_HOST"
)

// JoinFromEnv joins the rendezvous that EnvRendezvous names, as the
// worker EnvName names, of the job EnvJob names, with the model's
// fingerprint (0: any). When the environment names TLS files (mtls.EnvCA,
// EnvCert and EnvKey), it joins over mutual TLS with them, and EnvName
// may be left unset: the worker is then the task its certificate names.
// mtls.EnvRequire refuses a join without them.
func JoinFromEnv(ctx context.Context, fingerprint uint64, opts ...JoinOption) (*Member, error) {
	h := Hello{Job: os.Getenv(EnvJob), Name: os.Getenv(EnvName), Fingerprint: fingerprint}
	addr := os.Getenv(EnvRendezvous)
	cfg, creds, err := mtls.Resolve(nil, os.LookupEnv)
	switch {
	case err != nil:
		return nil, fmt.Errorf("elastic: %w", err)
	case addr == "":
		return nil, fmt.Errorf("elastic: %s is not set: start the worker with tfdist launch --elastic, or set it to the rendezvous's host:port", EnvRendezvous)
	case h.Name == "" && creds != nil:
		h.Name = creds.Identity().Task.String()
	case h.Name == "":
		return nil, fmt.Errorf("elastic: %s is not set: expected the worker's name, e.g. worker:3", EnvName)
	}
	if cfg != nil {
		opts = append([]JoinOption{WithClientTLS(cfg)}, opts...)
	}
	return Join(ctx, addr, h, opts...)
}
