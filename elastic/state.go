package elastic

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/collective"
)

// state is the job as the server's state loop keeps it.
type state struct {
	cfg         serverConfig
	fingerprint uint64
	epoch       uint32
	running     []*peer // the current membership, in rank order
	waiting     []*peer // admitted, not yet members, in arrival order
	claims      []*peer // not yet admitted: their name is a member's
	roundStart  time.Time
	belowSince  time.Time // since when too few are ready; zero when not
	lastArrival time.Time // of a ready joiner, before the first membership
	left        []Departure
	flaps       map[string][]time.Time
	finishing   bool
	replayed    int // under WithReplay, the memberships of the schedule formed
}

func newState(cfg serverConfig, now time.Time) *state {
	return &state{cfg: cfg, belowSince: now, flaps: map[string][]time.Time{}}
}

func (st *state) send(p *peer, m message) {
	if p.gone {
		return
	}
	select {
	case p.out <- m:
	default:
		st.drop(p, time.Now(), "it did not read the rendezvous's messages")
	}
}

// drop ends p's connection after the messages queued for it; a member's
// departure is recorded with why.
func (st *state) drop(p *peer, now time.Time, why string) {
	if p.gone {
		return
	}
	p.gone = true
	close(p.out)
	if i := index(st.running, p); i >= 0 {
		st.running = append(st.running[:i], st.running[i+1:]...)
		d := Departure{Epoch: st.epoch, Name: p.hello.Name, At: now, Why: why}
		st.left = append(st.left, d)
		if !p.leaving {
			st.flaps[p.hello.Name] = append(st.flaps[p.hello.Name], now)
			for _, q := range slices.Clone(st.running) { // their group waits for it in vain: they may abort it
				st.send(q, message{Kind: kindLost, Left: []Departure{d}})
			}
		}
		st.cfg.log.Info("a member left", zap.String("member", p.hello.Name), zap.String("why", why))
		if !st.finishing {
			st.startRound(now)
		}
	}
	if i := index(st.waiting, p); i >= 0 {
		st.waiting = append(st.waiting[:i], st.waiting[i+1:]...)
	}
	if i := index(st.claims, p); i >= 0 {
		st.claims = append(st.claims[:i], st.claims[i+1:]...)
	}
	st.settleClaims(now)
}

func index(ps []*peer, p *peer) int {
	for i, q := range ps {
		if q == p {
			return i
		}
	}
	return -1
}

// handle applies one connection's event.
func (st *state) handle(ev event, now time.Time) {
	p := ev.p
	if p.gone {
		return
	}
	if ev.err != nil {
		why := "connection lost: " + ev.err.Error()
		if p.leaving {
			why = "left"
		}
		st.drop(p, now, why)
		return
	}
	p.lastSeen = now
	switch ev.msg.Kind {
	case kindHello:
		st.admit(p, now)
	case kindPing:
	case kindReady:
		st.ready(p, ev.msg.Report, now)
	case kindLeave:
		p.leaving = true
		if ev.msg.Done && !st.finishing {
			st.finish(now)
		}
		if index(st.running, p) < 0 {
			st.drop(p, now, "left")
		} else if !st.finishing {
			st.startRound(now)
		}
	default:
		st.drop(p, now, fmt.Sprintf("it sent a %q message, which workers do not send", ev.msg.Kind))
	}
}

// admit accepts or refuses a new worker. One named as a worker already in
// the job, a replacement started before the server saw its predecessor go,
// waits for that up to the heartbeat timeout (settleClaims).
func (st *state) admit(p *peer, now time.Time) {
	if st.named(p.hello.Name) != nil {
		p.claimed = now
		st.claims = append(st.claims, p)
		return
	}
	if why := st.refusal(p.hello, now); why != "" {
		st.cfg.log.Warn("refused a worker", zap.String("worker", p.hello.Name), zap.String("why", why))
		st.send(p, message{Kind: kindRefused, Reason: why, Done: st.finishing})
		st.drop(p, now, why)
		return
	}
	if st.cfg.job == "" {
		st.cfg.job = p.hello.Job
	}
	if st.fingerprint == 0 {
		st.fingerprint = p.hello.Fingerprint
	}
	st.waiting = append(st.waiting, p)
	st.send(p, message{Kind: kindAccepted})
	st.cfg.log.Info("admitted a worker", zap.String("worker", p.hello.Name))
}

// refusal says why a worker cannot join, or "".
func (st *state) refusal(h Hello, now time.Time) string {
	switch {
	case h.Protocol != ProtocolVersion:
		return fmt.Sprintf("it speaks rendezvous protocol %d; this job speaks %d", h.Protocol, ProtocolVersion)
	case st.cfg.job != "" && h.Job != st.cfg.job:
		return fmt.Sprintf("it belongs to job %q; this is job %q", h.Job, st.cfg.job)
	case h.Name == "":
		return "it gave no name"
	case st.fingerprint != 0 && h.Fingerprint != 0 && h.Fingerprint != st.fingerprint:
		return fmt.Sprintf("its model's fingerprint is %016x and the job's %016x: another model, or a variable of another shape", h.Fingerprint, st.fingerprint)
	case st.finishing:
		return "the job is finishing"
	}
	if n := st.recentFlaps(h.Name, now); st.cfg.flapLimit > 0 && n > st.cfg.flapLimit {
		return fmt.Sprintf("%s left %d times in the last %v (the limit is %d): it is excluded", h.Name, n, st.cfg.flapWindow, st.cfg.flapLimit)
	}
	return ""
}

// named returns the worker in the job named name, or nil.
func (st *state) named(name string) *peer {
	for _, q := range append(append([]*peer(nil), st.running...), st.waiting...) {
		if q.hello.Name == name {
			return q
		}
	}
	return nil
}

// settleClaims admits the claimants whose name is free, and refuses those
// that waited longer than the heartbeat timeout for it.
func (st *state) settleClaims(now time.Time) {
	for _, p := range append([]*peer(nil), st.claims...) {
		switch {
		case st.named(p.hello.Name) == nil:
			st.claims = append(st.claims[:index(st.claims, p)], st.claims[index(st.claims, p)+1:]...)
			st.admit(p, now)
		case now.Sub(p.claimed) > st.cfg.heartbeatTimeout:
			why := fmt.Sprintf("a worker named %s is already in the job", p.hello.Name)
			st.send(p, message{Kind: kindRefused, Reason: why})
			st.drop(p, now, why)
		}
	}
}

func (st *state) recentFlaps(name string, now time.Time) int {
	var kept []time.Time
	for _, t := range st.flaps[name] {
		if now.Sub(t) <= st.cfg.flapWindow {
			kept = append(kept, t)
		}
	}
	st.flaps[name] = kept
	return len(kept)
}

// ready records a worker at a step boundary.
func (st *state) ready(p *peer, r *Report, now time.Time) {
	if r == nil || r.Addr == "" {
		st.drop(p, now, "it reported without the address of its next group")
		return
	}
	p.report = r
	if st.finishing { // no membership forms again
		st.release(p, now)
		return
	}
	if index(st.running, p) >= 0 {
		st.startRound(now)
		return
	}
	if st.epoch == 0 {
		st.lastArrival = now
		return
	}
	if st.roundStart.IsZero() && st.grows() {
		st.startRound(now) // a joiner waits: the members report at their next boundary
	}
}

// startRound asks every member to report at its next step boundary.
func (st *state) startRound(now time.Time) {
	if st.epoch == 0 || st.finishing {
		return
	}
	if st.roundStart.IsZero() {
		st.roundStart = now
	}
	for _, q := range slices.Clone(st.running) { // a send may drop q
		if q.report == nil && !q.leaving {
			st.send(q, message{Kind: kindPending})
		}
	}
}

// checkHeartbeats drops the workers that have been silent too long.
func (st *state) checkHeartbeats(now time.Time) {
	st.settleClaims(now)
	for _, p := range append(append([]*peer(nil), st.running...), st.waiting...) {
		if now.Sub(p.lastSeen) > st.cfg.heartbeatTimeout {
			st.drop(p, now, fmt.Sprintf("no heartbeat for %v", st.cfg.heartbeatTimeout))
		}
	}
}

// nextDeadline is when advance must run next without an event: the
// earliest deadline still ahead (those passed, advance has handled).
func (st *state) nextDeadline(now time.Time) (time.Time, bool) {
	if st.finishing {
		return time.Time{}, false
	}
	var ds []time.Time
	if st.epoch == 0 && !st.lastArrival.IsZero() {
		ds = append(ds, st.lastArrival.Add(st.cfg.settle))
	}
	if !st.roundStart.IsZero() {
		ds = append(ds, st.roundStart.Add(st.cfg.roundTimeout))
	}
	if !st.belowSince.IsZero() {
		ds = append(ds, st.belowSince.Add(st.cfg.waitTimeout))
	}
	var next time.Time
	for _, d := range ds {
		if d.After(now) && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// advance forms the next membership once it can, and says whether the
// job is over (finished: nil; stopped: a *StopError).
func (st *state) advance(now time.Time) (bool, error) {
	if st.finishing {
		return len(st.running)+len(st.waiting) == 0, nil
	}
	if !st.roundStart.IsZero() && !st.roundOver(now) {
		return false, nil
	}
	if st.epoch > 0 && st.roundStart.IsZero() && st.belowSince.IsZero() {
		return false, nil // training, nothing to change
	}
	cands := st.candidates()
	if st.formsNow(cands, now) {
		st.form(cands, now)
		return false, nil
	}
	st.roundStart = time.Time{} // over: the reports wait for joiners
	if st.cfg.replay == nil && len(cands) >= st.cfg.min {
		return false, nil // the first group settles
	}
	if st.belowSince.IsZero() {
		st.belowSince = now
	}
	if now.Sub(st.belowSince) < st.cfg.waitTimeout {
		return false, nil
	}
	err := &StopError{Min: st.cfg.min, Have: len(cands), Wait: st.cfg.waitTimeout, Left: st.left, reason: st.replayStop()}
	st.cfg.log.Error("the job stops", zap.Error(err))
	st.stopAll(message{Kind: kindStop, Reason: err.Error(), Left: st.left})
	return true, err
}

// roundOver says whether every member has reported or left, dropping, once
// the round timeout has passed, those that have not.
func (st *state) roundOver(now time.Time) bool {
	var silent []*peer
	for _, p := range st.running {
		if p.report == nil && !p.leaving {
			silent = append(silent, p)
		}
	}
	if len(silent) > 0 && now.Sub(st.roundStart) < st.cfg.roundTimeout {
		return false
	}
	for _, p := range silent {
		st.drop(p, now, fmt.Sprintf("it did not report within the round timeout, %v", st.cfg.roundTimeout))
	}
	for _, p := range append([]*peer(nil), st.running...) {
		if p.leaving {
			st.drop(p, now, "left")
		}
	}
	return true
}

// formsNow says whether cands form the next membership now.
func (st *state) formsNow(cands []*peer, now time.Time) bool {
	if st.cfg.replay != nil {
		return cands != nil
	}
	return len(cands) >= st.cfg.min && (st.epoch > 0 || len(cands) == st.cfg.max || now.Sub(st.lastArrival) >= st.cfg.settle)
}

// candidates are the next membership: the members that reported, in rank
// order, then the ready joiners in the order of their names ("worker:2"
// before "worker:10"), up to the maximum; under a replay, the next
// membership of its schedule once all its workers are ready.
func (st *state) candidates() []*peer {
	if st.cfg.replay != nil {
		return st.replayCandidates()
	}
	joiners := slices.Clone(st.waiting)
	slices.SortStableFunc(joiners, func(a, b *peer) int {
		return cmp.Or(cmp.Compare(len(a.hello.Name), len(b.hello.Name)), cmp.Compare(a.hello.Name, b.hello.Name))
	})
	var c []*peer
	for _, p := range append(slices.Clone(st.running), joiners...) {
		if p.report != nil {
			c = append(c, p)
		}
	}
	return c[:st.size(len(c))]
}

// size is the largest membership size allowed of at most n workers, or 0.
func (st *state) size(n int) int {
	n = min(n, st.cfg.max)
	if st.cfg.sizes == nil {
		return n
	}
	for i := len(st.cfg.sizes) - 1; i >= 0; i-- {
		if st.cfg.sizes[i] <= n {
			return st.cfg.sizes[i]
		}
	}
	return 0
}

// grows says whether the members and the ready joiners make a larger
// membership than the current one.
func (st *state) grows() bool {
	if st.cfg.replay != nil {
		return false // a replay's memberships change at its steps only
	}
	n := len(st.running)
	for _, p := range st.waiting {
		if p.report != nil {
			n++
		}
	}
	return st.size(n) > len(st.running)
}

// form makes cands the next membership and tells each its place.
func (st *state) form(cands []*peer, now time.Time) {
	st.epoch++
	m := Membership{Epoch: st.epoch, Step: -1, Left: st.left}
	for i, p := range cands {
		m.Members = append(m.Members, collective.Member{Name: p.hello.Name, Addr: p.report.Addr})
		if p.report.Step > m.Step {
			m.Step, m.Holder = p.report.Step, i
		}
		if j := index(st.waiting, p); j >= 0 {
			m.Joined = append(m.Joined, p.hello.Name)
			st.waiting = append(st.waiting[:j], st.waiting[j+1:]...)
		}
	}
	st.replayStep(&m)
	st.record(m, now)
	for i, p := range cands {
		mi := m
		mi.Rank = i
		st.send(p, message{Kind: kindMembership, Membership: &mi})
		p.report = nil
	}
	for _, p := range slices.Backward(st.running) {
		if index(cands, p) < 0 { // a standby until a size takes it
			st.waiting = append([]*peer{p}, st.waiting...)
		}
	}
	st.running = cands
	st.roundStart, st.belowSince, st.left = time.Time{}, time.Time{}, nil
	st.cfg.log.Info("membership formed", zap.Uint32("epoch", m.Epoch), zap.Int("members", len(cands)),
		zap.Int64("step", m.Step), zap.Strings("joined", m.Joined), zap.Int("left", len(m.Left)))
	if st.grows() {
		st.startRound(now)
	}
}

// finish starts the job's end: a member is done, so no membership forms
// again, and the workers waiting for one are told.
func (st *state) finish(now time.Time) {
	st.finishing = true
	st.cfg.log.Info("the job is finishing")
	for _, p := range append(append(slices.Clone(st.waiting), st.claims...), st.running...) {
		if p.report != nil || index(st.running, p) < 0 {
			st.release(p, now)
		}
	}
}

// release tells p, which waits for a membership, that the job has
// finished: the members that waited to re-form after a failure at the
// very end, the standbys, and those not yet admitted.
func (st *state) release(p *peer, now time.Time) {
	st.send(p, message{Kind: kindStop, Done: true, Reason: "the job has finished"})
	p.leaving = true // not a flap
	st.drop(p, now, "the job has finished")
}

// stopAll sends m to every worker and ends their connections.
func (st *state) stopAll(m message) {
	for _, p := range append(append(append([]*peer(nil), st.running...), st.waiting...), st.claims...) {
		st.send(p, m)
		p.gone = true
		close(p.out)
	}
	st.running, st.waiting, st.claims = nil, nil, nil
}
