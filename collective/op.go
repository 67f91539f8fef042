package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// op is one local call of a collective operation.
type op struct {
	g          *Group
	ctx        context.Context
	name       string
	self       header // this call's header; sends vary offset, step, chunk, length
	box        *mailbox
	timer      *time.Timer
	timerC     <-chan time.Time
	deadline   time.Time          // bound on writes: the earlier of timeout and ctx deadline
	cancelled  bool               // ctx ended the call
	hdr        []byte             // encoded header scratch
	leases     []*remoteLease     // by peer: expose this call's buffers to it (remote.go)
	readFrom   []bool             // by peer: the call read remote chunks from it
	ref        [remoteRefLen]byte // a remote chunk's payload scratch
	exposed    [][]byte           // the chunks sent by address, kept reachable until the leases end (remote.go)
	pushedTo   bool               // peers may write into this call's result, at pushedInto of the arena (push.go)
	pushedInto int
	begun      time.Time // when the call started
	warnAt     time.Time // when the timer next fires to warn of a hang rather than time out; zero once warned
	bytes      int       // the payload of this member's buffer (Record)
	algorithm  string    // how the call moves data (Record)
}

// start registers a call under the next sequence number of its name.
func (g *Group) start(ctx context.Context, name string, self header) (*op, error) {
	o := &op{g: g, ctx: ctx, name: name, self: self, begun: time.Now(), algorithm: self.op.algorithm()}
	o.self.kind, o.self.epoch, o.self.name = kindData, g.cfg.epoch, []byte(name)
	o.bytes = int(self.count) * self.dtype.Size()
	o.startTimer()
	if d, ok := ctx.Deadline(); ok && (o.deadline.IsZero() || d.Before(o.deadline)) {
		o.deadline = d
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		o.stopTimer()
		return nil, g.err
	}
	if g.closing[g.rank] && name != closeName {
		o.stopTimer()
		return nil, ErrClosed
	}
	ns := g.names[name]
	if ns == nil {
		ns = &nameState{boxes: make(map[uint64]*mailbox)}
		g.names[name] = ns
	}
	o.self.seq = ns.next
	ns.next++
	o.box = g.box(o.self.name, o.self.seq)
	o.box.active = true
	g.started[self.op].Add(1)
	return o, nil
}

// startTimer sets the timer to the call's first hang warning or its
// timeout, whichever comes first.
func (o *op) startTimer() {
	cfg := o.g.cfg
	first := cfg.hangWarning
	if cfg.timeout > 0 {
		o.deadline = o.begun.Add(cfg.timeout)
		if first <= 0 || first >= cfg.timeout {
			first = cfg.timeout
		}
	}
	if first <= 0 {
		return
	}
	if first != cfg.timeout {
		o.warnAt = o.begun.Add(first)
	}
	o.timer = time.NewTimer(first)
	o.timerC = o.timer.C
}

func (o *op) stopTimer() {
	if o.timer != nil {
		o.timer.Stop()
	}
}

// end unregisters the call and returns its result. Any error but the
// caller's cancellation breaks the group.
func (o *op) end(err error) error {
	o.revokeLeases()
	o.exposed = nil
	o.stopTimer()
	g := o.g
	g.mu.Lock()
	if o.box.ring != nil {
		o.box.ring.detach()
	}
	o.box.drop()
	rec := o.record(err)
	if o.cancelled {
		o.box.abandoned = true
	} else {
		delete(g.names[o.name].boxes, o.self.seq)
	}
	g.mu.Unlock()
	if g.cfg.observer != nil {
		g.cfg.observer(rec)
	}
	if err != nil && o.pushedTo {
		g.arena.quarantine(o.pushedInto)
	}
	if err != nil && !o.cancelled {
		g.fail(err)
	}
	return err
}

// send writes one data frame of this call to peer.
func (o *op) send(peer int, step, chunk, offset int, payload []byte) error {
	h := &o.self
	h.step, h.chunk, h.offset, h.length = uint32(step), uint32(chunk), uint64(offset), uint32(len(payload))
	o.hdr = appendHeader(o.hdr[:0], h)
	err := o.g.conns[peer].write(o.deadline, o.hdr, payload)
	if err == nil {
		o.g.sent.Add(int64(len(payload)))
		return nil
	}
	if gerr := o.g.Err(); gerr != nil {
		return gerr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return o.timeoutErr(peer, nil)
	}
	return o.g.writeFailed(peer, fmt.Errorf("sending %s %q: %w", o.self.op, o.name, err))
}

// recv returns the next frame of this call from peer, checked against the
// call's header. later are peers the caller will wait for next; a timeout
// names those of them that have sent nothing either.
func (o *op) recv(peer int, later []int) (frame, error) {
	for {
		f, ok, err := o.take(peer)
		if err != nil {
			return f, err
		}
		if ok {
			if err := o.check(peer, &f.h); err != nil {
				f.release()
				return frame{}, err
			}
			return f, nil
		}
		if err := o.wait(peer, later); err != nil {
			return frame{}, err
		}
	}
}

func (o *op) take(peer int) (frame, bool, error) {
	g := o.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := o.box.pop(peer); ok {
		return f, true, nil
	}
	if g.left[peer] {
		return frame{}, false, g.peerError(peer, errLeft)
	}
	if g.closing[peer] && o.name != closeName {
		return frame{}, false, g.peerError(peer, errClosing)
	}
	return frame{}, false, nil
}

// wait blocks until a frame arrives, the group breaks, ctx ends or the
// call times out.
func (o *op) wait(peer int, later []int) error {
	select {
	case <-o.box.signal:
		return nil
	case <-o.g.broken:
		return o.g.Err()
	case <-o.ctx.Done():
		o.cancelled = true
		return fmt.Errorf("collective: %s %q waiting for %s: %w", o.self.op, o.name, o.g.members[peer], o.ctx.Err())
	case <-o.timerC:
		if o.warnAt.IsZero() {
			return o.timeoutErr(peer, later)
		}
		o.warnAt = time.Time{}
		o.warnHang(peer, later)
		if o.g.cfg.timeout <= 0 {
			o.timerC = nil
		} else {
			o.timer.Reset(time.Until(o.begun.Add(o.g.cfg.timeout)))
		}
		return nil
	}
}

// timeoutErr names peer and those of later that have sent nothing.
func (o *op) timeoutErr(peer int, later []int) error {
	g := o.g
	g.mu.Lock()
	defer g.mu.Unlock()
	e := &TimeoutError{Op: o.self.op.String(), Name: o.name, After: g.cfg.timeout}
	var details []string
	for i, p := range append([]int{peer}, later...) {
		if i > 0 && len(o.box.queues[p]) > 0 {
			continue
		}
		e.Peers = append(e.Peers, g.members[p])
		if d := g.orphans(p); d != "" {
			details = append(details, d)
		}
	}
	e.Detail = strings.Join(details, "; ")
	return e
}
