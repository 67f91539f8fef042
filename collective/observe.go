package collective

import (
	"time"

	"go.uber.org/zap"
)

// Record describes one operation of this member once it has ended: what
// it moved, how, and who it waited for.
type Record struct {
	Op        string // "all-reduce", "reduce-scatter", "all-gather", "broadcast" or "barrier"
	Name      string // the tensor name
	Bytes     int    // the payload of this member's buffer
	Algorithm string // "direct", "ring", "ring, pushed", "tree", "tree, by segment", "gather", "broadcast"
	Transport string // "shared memory", "tcp" or "mixed", over this member's links
	Start     time.Time
	End       time.Time
	// Wait is how long the call waited, from its start, for the last
	// member it heard from to arrive (its first frame of the operation).
	// Direct all-reduces, gathers and barriers hear from every member; a
	// ring member hears from its neighbours only.
	Wait time.Duration
	// Last is the member that arrived last of those heard from, this one
	// included, and Margin how long after the one before it.
	Last   Member
	Margin time.Duration
	Err    error
}

// WithObserver makes the group call fn with the Record of every operation
// once it ends, on the goroutine that made the call. fn must be quick and
// safe for concurrent use, as operations run concurrently.
func WithObserver(fn func(Record)) Option { return func(c *config) { c.observer = fn } }

// WithHangWarning sets how long an operation waits for a peer before the
// group logs, once per operation, what it is waiting for and from whom
// (10s by default, and never later than the timeout).
func WithHangWarning(d time.Duration) Option { return func(c *config) { c.hangWarning = d } }

// arrivals returns, of the members heard from in this call and this
// member, the last to arrive, by how much after the one before it, and
// how long this call waited for it. Caller holds g.mu.
func (o *op) arrivals() (last int, margin, wait time.Duration) {
	last = o.g.rank
	latest, before := o.begun, time.Time{}
	for p, t := range o.box.first {
		switch {
		case t.IsZero() || p == o.g.rank:
		case t.After(latest):
			last, latest, before = p, t, latest
		case t.After(before):
			before = t
		}
	}
	if !before.IsZero() {
		margin = latest.Sub(before)
	}
	return last, margin, max(0, latest.Sub(o.begun))
}

// record accounts for the call's wait in the group's and returns its
// Record, empty without an observer. Caller holds g.mu.
func (o *op) record(err error) Record {
	g := o.g
	last, margin, wait := o.arrivals()
	if waited := o.begun.Add(wait); waited.After(g.waitedUntil) {
		g.peerWait += waited.Sub(later(o.begun, g.waitedUntil))
		g.waitedUntil = waited
	}
	if g.cfg.observer == nil {
		return Record{}
	}
	return Record{
		Op: o.self.op.String(), Name: o.name, Bytes: o.bytes, Algorithm: o.algorithm, Transport: g.transport(),
		Start: o.begun, End: time.Now(), Wait: wait, Last: g.members[last], Margin: margin, Err: err,
	}
}

// algorithm is how an operation of kind k moves data, until it says
// otherwise.
func (k opKind) algorithm() string {
	switch k {
	case opAllReduce:
		return "direct"
	case opAllGather, opBarrier:
		return "gather"
	}
	return k.String()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// transport names what this member's links run on.
func (g *Group) transport() string {
	shm, tcp := 0, 0
	for _, p := range g.peers {
		if c := g.conns[p]; c != nil && c.viewer != nil {
			shm++
		} else {
			tcp++
		}
	}
	switch {
	case tcp == 0:
		return "shared memory"
	case shm == 0:
		return "tcp"
	}
	return "mixed"
}

// warnHang logs, once, that the call has waited long for peer.
func (o *op) warnHang(peer int, later []int) {
	waiting := []string{o.g.members[peer].Name}
	for _, p := range later {
		waiting = append(waiting, o.g.members[p].Name)
	}
	o.g.log.Warn("collective operation waiting for peers",
		zap.String("op", o.self.op.String()), zap.String("name", o.name), zap.Uint64("call", o.self.seq),
		zap.Strings("waiting_for", waiting), zap.Duration("waited", time.Since(o.begun)))
}
