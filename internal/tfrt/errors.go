package tfrt

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Code is a TensorFlow status code (tensorflow/core/protobuf/error_codes.proto).
type Code int

// The TensorFlow status codes, with the values of TF_Code.
const (
	OK                 Code = 0
	Cancelled          Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = map[Code]string{
	OK: "OK", Cancelled: "CANCELLED", Unknown: "UNKNOWN", InvalidArgument: "INVALID_ARGUMENT",
	DeadlineExceeded: "DEADLINE_EXCEEDED", NotFound: "NOT_FOUND", AlreadyExists: "ALREADY_EXISTS",
	PermissionDenied: "PERMISSION_DENIED", ResourceExhausted: "RESOURCE_EXHAUSTED",
	FailedPrecondition: "FAILED_PRECONDITION", Aborted: "ABORTED", OutOfRange: "OUT_OF_RANGE",
	Unimplemented: "UNIMPLEMENTED", Internal: "INTERNAL", Unavailable: "UNAVAILABLE",
	DataLoss: "DATA_LOSS", Unauthenticated: "UNAUTHENTICATED",
}

// String returns the code's name as TensorFlow spells it, e.g. "UNAVAILABLE".
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE(%d)", int(c))
}

// Error is a failed TensorFlow status. Callers branch on it with errors.As, or
// with errors.Is against the sentinel of its code (ErrUnavailable, …).
type Error struct {
	Code Code   // TensorFlow's status code
	Op   string // what tfdist was doing, e.g. "start server"
	Msg  string // TensorFlow's message
}

// Error returns "op: CODE: message", the message cut after its first
// maxShownMessage bytes (Msg keeps it whole).
func (e *Error) Error() string {
	msg := shownMessage(e.Msg)
	if e.Op == "" {
		return fmt.Sprintf("%s: %s", e.Code, msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.Op, e.Code, msg)
}

// maxShownMessage bounds what an Error shows of TensorFlow's message: some
// quote a whole request to a task, the contents of its tensors included.
const maxShownMessage = 2048

// shownMessage returns msg, or its first maxShownMessage bytes (whole
// characters) and how many it leaves out.
func shownMessage(msg string) string {
	if len(msg) <= maxShownMessage {
		return msg
	}
	cut := maxShownMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… [%d more bytes of TensorFlow's message]", msg[:cut], len(msg)-cut)
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s, ok := target.(codeSentinel)
	return ok && Code(s) == e.Code
}

type codeSentinel Code

func (s codeSentinel) Error() string { return Code(s).String() }

// Sentinels for errors.Is, one per status code.
var (
	ErrCancelled          error = codeSentinel(Cancelled)
	ErrUnknown            error = codeSentinel(Unknown)
	ErrInvalidArgument    error = codeSentinel(InvalidArgument)
	ErrDeadlineExceeded   error = codeSentinel(DeadlineExceeded)
	ErrNotFound           error = codeSentinel(NotFound)
	ErrAlreadyExists      error = codeSentinel(AlreadyExists)
	ErrPermissionDenied   error = codeSentinel(PermissionDenied)
	ErrResourceExhausted  error = codeSentinel(ResourceExhausted)
	ErrFailedPrecondition error = codeSentinel(FailedPrecondition)
	ErrAborted            error = codeSentinel(Aborted)
	ErrOutOfRange         error = codeSentinel(OutOfRange)
	ErrUnimplemented      error = codeSentinel(Unimplemented)
	ErrInternal           error = codeSentinel(Internal)
	ErrUnavailable        error = codeSentinel(Unavailable)
	ErrDataLoss           error = codeSentinel(DataLoss)
	ErrUnauthenticated    error = codeSentinel(Unauthenticated)
)

// messageCodes recognises the status code of an error that reached Go as a
// message only: graft's session errors carry TensorFlow's message but not its
// code. The fragments are the ones TensorFlow's runtime writes.
var messageCodes = []struct {
	fragment string
	code     Code
}{
	{"Deadline Exceeded", DeadlineExceeded},
	{"DEADLINE_EXCEEDED", DeadlineExceeded},
	{"timed out", DeadlineExceeded},
	{"Timed out", DeadlineExceeded},
	{"failed to connect to all addresses", Unavailable},
	{"Connection reset by peer", Unavailable},
	{"Socket closed", Unavailable},
	{"Connection refused", Unavailable},
	{"UNAVAILABLE", Unavailable},
	{"is unavailable", Unavailable},
	{"Cancelled", Cancelled},
	{"CANCELLED", Cancelled},
	{"Collective ops is aborted", Aborted},
	{"ABORTED", Aborted},
	{"not found", NotFound},
	{"Not found", NotFound},
	{"OutOfRange", OutOfRange},
	{"Out of range", OutOfRange},
	{"Invalid argument", InvalidArgument},
	{"INVALID_ARGUMENT", InvalidArgument},
}

// Classify turns an error returned by graft (a TensorFlow status whose code
// graft does not expose) into an *Error, inferring the code from TensorFlow's
// message; op names what tfdist was doing. It returns nil for nil, and err
// unchanged when it already wraps an *Error.
func Classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	msg := err.Error()
	if code, ok := leadingCode(msg); ok {
		return &Error{Code: code, Op: op, Msg: msg}
	}
	code := Unknown
	for _, m := range messageCodes {
		if strings.Contains(msg, m.fragment) {
			code = m.code
			break
		}
	}
	return &Error{Code: code, Op: op, Msg: msg}
}

// leadingCode returns the status code a message starts with, as TensorFlow
// writes a status ("INVALID_ARGUMENT: …"). That code is the run's own: the
// rest of the message may quote other tasks' errors, such as the
// cancellation of a step's other partitions, which must not decide it.
// UNKNOWN is not taken: its message's fragments say more.
func leadingCode(msg string) (Code, bool) {
	name, _, ok := strings.Cut(msg, ":")
	if !ok {
		return 0, false
	}
	for c, n := range codeNames {
		if n == name && c != Unknown && c != OK {
			return c, true
		}
	}
	return 0, false
}
