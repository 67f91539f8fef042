package elastic

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// ProtocolVersion is the version of the rendezvous protocol. A worker that
// speaks another is refused.
const ProtocolVersion = 2

// maxMessage bounds a message's encoded size.
const maxMessage = 1 << 20

// The kinds of message.
const (
	kindHello      = "hello"      // worker → server: who it is
	kindAccepted   = "accepted"   // server → worker: admitted, waiting for a membership
	kindRefused    = "refused"    // server → worker: not admitted, and why
	kindPing       = "ping"       // worker → server: alive
	kindReady      = "ready"      // worker → server: at a step boundary, wants the next membership
	kindLeave      = "leave"      // worker → server: leaves at this boundary
	kindPending    = "pending"    // server → worker: a change waits for the next boundary
	kindMembership = "membership" // server → worker: the next membership
	kindStop       = "stop"       // server → worker: the job stops
	kindLost       = "lost"       // server → worker: a member of its membership is gone
)

// message is one frame: a big-endian uint32 length, then JSON.
type message struct {
	Kind       string      `json:"kind"`
	Hello      *Hello      `json:"hello,omitempty"`
	Report     *Report     `json:"report,omitempty"`
	Membership *Membership `json:"membership,omitempty"`
	Reason     string      `json:"reason,omitempty"`
	Left       []Departure `json:"left,omitempty"`
	Done       bool        `json:"done,omitempty"`
}

// Hello is what a worker tells the server when it joins.
type Hello struct {
	// Protocol is ProtocolVersion; Join sets it.
	Protocol int `json:"protocol"`
	// Job names the job; a worker of another job is refused.
	Job string `json:"job"`
	// Name names the worker in memberships, errors and logs, e.g.
	// "worker:2". Two members cannot share a name.
	Name string `json:"name"`
	// Fingerprint identifies the model (say, a hash of its variables'
	// names, dtypes and shapes); a worker whose fingerprint differs from
	// the job's is refused. 0 matches any.
	Fingerprint uint64 `json:"fingerprint"`
}

// Report is what a member tells the server at a step boundary.
type Report struct {
	// Step is the number of steps the member's state has completed (the
	// next step's index): 0 for a worker that starts from the initial
	// state, -1 for one that holds no state.
	Step int64 `json:"step"`
	// Addr is the host:port the member's next collective group listens
	// on.
	Addr string `json:"addr"`
}

// Departure records a member that left.
type Departure struct {
	// Epoch is the membership it left.
	Epoch uint32 `json:"epoch"`
	// Name is the member's.
	Name string `json:"name"`
	// At is when the server saw it go.
	At time.Time `json:"at"`
	// Why says how: "left" for a graceful leave, otherwise the failure.
	Why string `json:"why"`
}

func (d Departure) String() string {
	return fmt.Sprintf("%s left at %s (%s)", d.Name, d.At.Format("15:04:05.000"), d.Why)
}

func writeMessage(w io.Writer, m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("elastic: %s message of %d bytes; the limit is %d", m.Kind, len(b), maxMessage)
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

func readMessage(r io.Reader) (message, error) {
	var m message
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return m, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxMessage {
		return m, fmt.Errorf("elastic: a message of %d bytes; the limit is %d (is the peer a rendezvous?)", size, maxMessage)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("elastic: a malformed message: %w", err)
	}
	return m, nil
}
