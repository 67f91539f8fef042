package taskserver

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// The protocol: every request is a POST to one of the paths, and carries
// the headers of the protocol's version and of the job; a client that
// knows the server's incarnation sends it, and the server refuses the
// request, unrun, if it is not its own. Every response carries the
// protocol's version and the server's incarnation. A response of status
// 200 carries the call's result; another, an error (wireError).
const (
	protocolVersion = "1"

	headerProtocol    = "Tfdist-Protocol"
	headerJob         = "Tfdist-Job"
	headerIncarnation = "Tfdist-Incarnation"
	headerExpect      = "Tfdist-Expect-Incarnation"
	// headerTimeout is how long, in milliseconds, the caller waits for
	// the response.
	headerTimeout = "Tfdist-Timeout-Ms"

	contentType = "application/x-tfdist-taskserver"

	pathPing        = "/tfdist/v1/ping"
	pathImport      = "/tfdist/v1/import"
	pathRun         = "/tfdist/v1/run"
	pathInstallPlan = "/tfdist/v1/plan/install"
	pathRunPlan     = "/tfdist/v1/plan/run"
)

// timeoutMillis is the header's value for a caller that waits d more:
// whole milliseconds rounded up, at least 1. Rounded down, the server's
// deadline could come before the caller's, and the caller would get the
// server's "stopped waiting" answer while its own deadline had not yet
// passed, and take it for another failure than a timeout.
func timeoutMillis(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// requestContext returns the context of r's work: r's, bounded by the time
// the caller waits.
func requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	ms, err := strconv.ParseInt(r.Header.Get(headerTimeout), 10, 64)
	if err != nil || ms <= 0 {
		return context.WithCancel(r.Context())
	}
	return context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
}
