package elastic

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tfdist/tfdist/collective"
)

// Membership is one epoch of the job: who trains together, in rank order.
type Membership struct {
	// Epoch numbers the memberships from 1; every change makes a new one.
	Epoch uint32 `json:"epoch"`
	// Members are the workers in rank order, each at the address its
	// Report gave.
	Members []collective.Member `json:"members"`
	// Rank is the receiving worker's index in Members.
	Rank int `json:"rank"`
	// Step is the most steps any member's state has completed: the group
	// goes on with step Step (counting from 0); -1 if none holds state.
	Step int64 `json:"step"`
	// Holder is the rank of a member whose state has completed Step steps;
	// the others take the state from it.
	Holder int `json:"holder"`
	// Joined names the members new in this epoch.
	Joined []string `json:"joined,omitempty"`
	// Left lists the members of the previous epoch that are gone.
	Left []Departure `json:"left,omitempty"`
	// Until, under a replay (WithReplay), is the step count this
	// membership ends at: its members stop after that step, as if the
	// membership changed there; 0 when it ends only on a change.
	Until int64 `json:"until,omitempty"`
}

// StopError is why a job stopped: too few members remained for longer
// than the wait timeout.
type StopError struct {
	// Min is the job's minimum, Have the members that remained.
	Min, Have int
	// Wait is how long the job waited for joiners.
	Wait time.Duration
	// Left are the members that left since the last membership.
	Left []Departure

	reason string // the server's words, on a worker
}

func (e *StopError) Error() string {
	if e.reason != "" {
		return e.reason
	}
	var left []string
	for _, d := range e.Left {
		left = append(left, d.String())
	}
	who := "none left"
	if len(left) > 0 {
		who = strings.Join(left, "; ")
	}
	return fmt.Sprintf("elastic: the job stopped: %d of its minimum of %d workers remained and none joined within %v: %s",
		e.Have, e.Min, e.Wait, who)
}

// ErrJobFinished is Join's and Member.Next's error once the job has
// finished: its members are done, and a worker that joins late, or waited
// as a standby, has nothing to do.
var ErrJobFinished = errors.New("elastic: the job has finished")

// RefusedError is a server's refusal of a worker.
type RefusedError struct {
	// Reason says why.
	Reason string
}

func (e *RefusedError) Error() string {
	return "elastic: the rendezvous refused this worker: " + e.Reason
}
