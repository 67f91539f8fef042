package elastic

import (
	"context"
	"fmt"
	"os"
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
// fingerprint (0: any).
func JoinFromEnv(ctx context.Context, fingerprint uint64, opts ...JoinOption) (*Member, error) {
	h := Hello{Job: os.Getenv(EnvJob), Name: os.Getenv(EnvName), Fingerprint: fingerprint}
	addr := os.Getenv(EnvRendezvous)
	switch {
	case addr == "":
		return nil, fmt.Errorf("elastic: %s is not set: start the worker with tfdist launch --elastic, or set it to the rendezvous's host:port", EnvRendezvous)
	case h.Name == "":
		return nil, fmt.Errorf("elastic: %s is not set: expected the worker's name, e.g. worker:3", EnvName)
	}
	return Join(ctx, addr, h, opts...)
}
