package elastic

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"go.uber.org/zap"
)

// LogEntry is a line of a job's membership log (WithLog): a membership the
// rendezvous formed, whose members, in rank order, trained from step Step
// until the next entry's Step, or to the end.
type LogEntry struct {
	Epoch   uint32      `json:"epoch"`
	Step    int64       `json:"step"`
	Members []string    `json:"members"`
	Joined  []string    `json:"joined,omitempty"`
	Left    []Departure `json:"left,omitempty"`
	At      time.Time   `json:"at"`
}

// WithLog writes the job's membership log to w, a JSON line (a LogEntry)
// per membership as it forms: which workers trained which steps, the
// schedule WithReplay replays.
func WithLog(w io.Writer) Option { return func(c *serverConfig) { c.logTo = w } }

// WithReplay replays a membership log without its failures: membership i
// has exactly the workers entries[i] names, in its order, and ends after
// step entries[i+1].Step (Membership.Until), whatever joins or leaves in
// between; a worker of no current membership waits as a standby. Every
// named worker must join (a replay's workers run from the start), and
// WithMembers and WithSizes do not apply. A program that trains the same
// batches at the same steps then ends with the model of the job that
// wrote the log. Entries that trained no step (a membership that broke
// before its first) are skipped.
func WithReplay(entries []LogEntry) Option {
	return func(c *serverConfig) { c.replay = slices.Clone(entries) }
}

// ReadLog reads a membership log that WithLog wrote.
func ReadLog(r io.Reader) ([]LogEntry, error) {
	var out []LogEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxMessage)
	for line := 1; sc.Scan(); line++ {
		var e LogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("elastic: membership log line %d: %w", line, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("elastic: membership log: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("elastic: membership log: no membership")
	}
	return out, nil
}

// schedule returns the memberships a replay forms: the entries that
// trained at least a step, each with the step it ends after (0 for the
// last).
func schedule(entries []LogEntry) ([]LogEntry, []int64, error) {
	if len(entries) == 0 {
		return nil, nil, errors.New("elastic: WithReplay: no membership to replay")
	}
	var kept []LogEntry
	for i, e := range entries {
		switch {
		case len(e.Members) == 0:
			return nil, nil, fmt.Errorf("elastic: WithReplay: entry %d (epoch %d) has no members", i, e.Epoch)
		case slices.Contains(e.Members, ""):
			return nil, nil, fmt.Errorf("elastic: WithReplay: entry %d (epoch %d) names a member \"\"", i, e.Epoch)
		case i > 0 && e.Step < entries[i-1].Step:
			return nil, nil, fmt.Errorf("elastic: WithReplay: entry %d (epoch %d) starts at step %d, before the step %d of the entry before it", i, e.Epoch, e.Step, entries[i-1].Step)
		case i == 0 && e.Step > 0:
			return nil, nil, fmt.Errorf("elastic: WithReplay: the first entry starts at step %d, expected 0 (a log from the job's start)", e.Step)
		}
		if n := len(kept); n > 0 && kept[n-1].Step == e.Step {
			kept[n-1] = e // the one before trained no step
			continue
		}
		kept = append(kept, e)
	}
	until := make([]int64, len(kept))
	for i := range kept[:len(kept)-1] {
		until[i] = kept[i+1].Step
	}
	return kept, until, nil
}

// record writes m's entry to the membership log, if any.
func (st *state) record(m Membership, now time.Time) {
	if st.cfg.logTo == nil {
		return
	}
	e := LogEntry{Epoch: m.Epoch, Step: max(m.Step, 0), Joined: m.Joined, Left: m.Left, At: now}
	for _, mb := range m.Members {
		e.Members = append(e.Members, mb.Name)
	}
	b, err := json.Marshal(e)
	if err == nil {
		_, err = st.cfg.logTo.Write(append(b, '\n'))
	}
	if err != nil {
		st.cfg.log.Warn("could not write the membership log", zap.Uint32("epoch", m.Epoch), zap.Error(err))
	}
}

// replayStep, under a replay, gives m the step it ends after, and counts
// it formed.
func (st *state) replayStep(m *Membership) {
	if st.cfg.replay == nil {
		return
	}
	if want := st.cfg.replay[st.replayed].Step; m.Step != want && !(want == 0 && m.Step < 0) {
		st.cfg.log.Warn("the replay's membership goes on from another step than the log's",
			zap.Uint32("epoch", m.Epoch), zap.Int64("step", m.Step), zap.Int64("logged", want))
	}
	m.Until = st.cfg.until[st.replayed]
	st.replayed++
}

// replayStop is why a replay stopped waiting for its next membership's
// workers ("" when not replaying).
func (st *state) replayStop() string {
	if st.cfg.replay == nil {
		return ""
	}
	if st.replayed >= len(st.cfg.replay) {
		return fmt.Sprintf("elastic: the replay stopped: a member of its last membership left (%v), and a replay has no membership after it", st.left)
	}
	_, missing := st.replayNext()
	return fmt.Sprintf("elastic: the replay stopped: its membership %d of %d needs %v, and %v did not report within %v",
		st.replayed+1, len(st.cfg.replay), st.cfg.replay[st.replayed].Members, missing, st.cfg.waitTimeout)
}

// replayCandidates are the workers of the replay's next membership, in
// its order, once every one has reported; nil until then.
func (st *state) replayCandidates() []*peer {
	if st.replayed >= len(st.cfg.replay) {
		return nil
	}
	if ready, missing := st.replayNext(); len(missing) == 0 {
		return ready
	}
	return nil
}

// replayNext splits the workers of the replay's next membership into
// those that have reported, in its order, and the names of the others.
func (st *state) replayNext() (ready []*peer, missing []string) {
	for _, name := range st.cfg.replay[st.replayed].Members {
		if p := st.named(name); p != nil && p.report != nil {
			ready = append(ready, p)
		} else {
			missing = append(missing, name)
		}
	}
	return ready, missing
}
