package taskserver

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// ErrUnknown is wrapped by the error of a call that names a fragment
// prefix or a plan id its server does not hold: never imported or
// installed there, or lost with a restart. The caller imports or installs
// it again.
var ErrUnknown = errors.New("not imported or installed on the task")

// ErrUnavailable is wrapped by the error of a call whose server could not
// be reached or did not answer in time (connection refused or reset,
// timeout); the error names the address.
var ErrUnavailable = errors.New("task server unavailable")

// ErrRestarted is wrapped by the error of a call that reached a server
// whose incarnation is not the one the client saw before: the task
// restarted, and lost what was imported and installed on it, and a ps
// task its variables. The call was not run; the next one is.
var ErrRestarted = errors.New("task server restarted")

// RefusedError reports a request a server refused: of another job or
// protocol version, with a certificate it does not accept, or to a server
// that does not speak the protocol (plaintext against TLS).
type RefusedError struct {
	// Addr is the address of the server.
	Addr string
	// Reason says why.
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("taskserver: %s refused the request: %s", e.Addr, e.Reason)
}

// The kinds of error a response carries.
const (
	kindOther byte = iota
	kindTensorFlow
	kindUnknown
	kindRefused
	kindUnavailable
	kindRestarted
)

// wireError is an error as it crosses the wire: its text, what it is
// (kind and, for a TensorFlow error or a refusal, their fields) and the
// task of the plan's run that failed, if any.
type wireError struct {
	kind  byte
	text  string
	code  tfrt.Code // kindTensorFlow
	op    string    // kindTensorFlow
	msg   string    // kindTensorFlow: TensorFlow's message; kindRefused: the reason
	addr  string    // kindRefused: the refusing server
	task  string    // the task of a partition.RunError ("" if none)
	round int
}

// toWire describes err for the wire.
func toWire(err error) wireError {
	var w wireError
	var re *partition.RunError
	if errors.As(err, &re) {
		w.task, w.round, err = re.Task, re.Round, re.Err
	}
	w.text = err.Error()
	var te *tfrt.Error
	var ref *RefusedError
	switch {
	case errors.As(err, &te):
		w.kind, w.code, w.op, w.msg = kindTensorFlow, te.Code, te.Op, te.Msg
	case errors.As(err, &ref):
		w.kind, w.msg, w.addr = kindRefused, ref.Reason, ref.Addr
	case errors.Is(err, ErrUnknown):
		w.kind = kindUnknown
	case errors.Is(err, ErrRestarted):
		w.kind = kindRestarted
	case errors.Is(err, ErrUnavailable):
		w.kind = kindUnavailable
	}
	return w
}

// status is the HTTP status of a response carrying w.
func (w wireError) status() int {
	switch {
	case w.task != "":
		return http.StatusInternalServerError
	case w.kind == kindUnknown:
		return http.StatusNotFound
	case w.kind == kindRestarted:
		return http.StatusPreconditionFailed
	case w.kind == kindRefused:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// rebuild returns the error w describes, which the server at addr
// returned: errors.Is and errors.As find in it what they found on the
// server (ErrUnknown, a *tfrt.Error, a *partition.RunError, …).
func (w wireError) rebuild(addr string) error {
	var cause error
	switch w.kind {
	case kindTensorFlow:
		cause = &tfrt.Error{Code: w.code, Op: w.op, Msg: w.msg}
	case kindRefused:
		if w.addr == "" {
			w.addr = addr
		}
		cause = &RefusedError{Addr: w.addr, Reason: w.msg}
	case kindUnknown:
		cause = ErrUnknown
	case kindUnavailable:
		cause = ErrUnavailable
	case kindRestarted:
		cause = ErrRestarted
	}
	var err error = &remoteError{text: w.text, cause: cause}
	if w.task != "" {
		err = &partition.RunError{Task: w.task, Round: w.round, Err: err}
	}
	return err
}

// remoteError is an error a server returned: its text, and the error it
// wraps, rebuilt.
type remoteError struct {
	text  string
	cause error
}

func (e *remoteError) Error() string { return e.text }

func (e *remoteError) Unwrap() error { return e.cause }
