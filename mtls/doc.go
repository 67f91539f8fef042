// Package mtls authenticates and encrypts the traffic between the workers
// of a job with mutual TLS 1.3.
//
// Every task holds a certificate signed by the job's certificate authority
// (CA). The certificate names the task in one URI subject alternative
// name:
//
//	tfdist://<job>/<task type>/<task index>     e.g. tfdist://mnist-7/worker/1
//
// A connection is accepted only when the peer's certificate chains to the
// CA, is valid now, is meant for client and server authentication, names
// the same job as this task's own certificate, and names the task the
// cluster spec expects at that end of the connection: the task whose
// address was dialled, or the task whose rank the dialler claims. The
// host names and IP addresses in a certificate play no part, so the same
// certificates serve a job wherever its tasks are scheduled.
//
// A task finds its files through Files, set by a strategy's options or by
// the environment (EnvCA, EnvCert, EnvKey; EnvRequire makes a program
// refuse to start on a path that cannot use TLS). Load reads and checks
// them before any connection is made, and Credentials reload them when they
// change on disk, so certificates rotate without a restart. Their Config
// (or LoadConfig, from the files) is the *tls.Config that
// collective.WithTLS and multiworker.WithTLS take.
//
// Authority makes a CA and task certificates for local and test use (ECDSA
// P-256, short lifetimes, files written with mode 0600); "tfdist cert" and
// "tfdist launch --tls" use it.
package mtls
