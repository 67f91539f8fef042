// Package taskserver carries the runs of a graph split across tasks
// (package partition) between the tasks' processes over tfdist's own
// connections: TensorFlow computes on each task, taskserver moves the
// fragments, the feeds and the fetches.
//
// A Server serves one task's partition.Host: fragments are imported into
// it, run (Client.Runner), and plans are installed on it and executed
// there (Client.InstallPlan, Client.RunPlan), the server then talking to
// the plan's other tasks directly. A chief sends a step's feeds to a
// worker; the worker runs the step with the ps tasks.
//
// The protocol is HTTP/1.1 over keep-alive connections, optionally mutual
// TLS (package mtls), with binary bodies. Every request names the
// protocol's version and the job (the cluster spec's fingerprint, WithJob);
// a server refuses another's, and writes the refusal, with the peer's
// certificate under TLS, to the audit log (the logger named "audit").
// Every response carries the server's incarnation, new each time a server
// starts: a client that sees it change fails the call with ErrRestarted,
// for a restarted task has lost what was imported and installed on it, and
// a ps task its variables.
package taskserver
