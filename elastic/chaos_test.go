package elastic_test

import (
	"errors"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/elastic"
)

// chaosRuns is how many kill-and-replace runs TestKilledWorkerIsReplaced
// makes; ELASTIC_CHAOS_RUNS sets more.
func chaosRuns() int {
	if n, err := strconv.Atoi(os.Getenv("ELASTIC_CHAOS_RUNS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// finished checks that every process in ps trained every step, every
// example once, and exited cleanly.
func (j *job) finished(ps ...*proc) {
	j.t.Helper()
	j.waitFor("the workers to finish", func() bool {
		for _, p := range ps {
			if !p.exited {
				return false
			}
		}
		return true
	})
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range ps {
		require.NoError(j.t, p.err, "%s", p.name)
		last := p.lines[len(p.lines)-1]
		require.Equal(j.t, "done", last.Event, "%s: %+v", p.name, last)
		assert.Equal(j.t, int64(j.steps), last.Step, "%s", p.name)
		assert.True(j.t, last.Once, "%s: an example was lost or trained twice", p.name)
	}
}

// TestKilledWorkerIsReplaced kills a random worker of four at a random
// step and starts a replacement: the survivors go on without a restart,
// the replacement joins, and every example of every step is trained
// exactly once.
func TestKilledWorkerIsReplaced(t *testing.T) {
	var heals, joins []time.Duration
	for run := range chaosRuns() {
		heal, join := killAndReplace(t, run)
		heals, joins = append(heals, heal), append(joins, join)
	}
	t.Logf("from a kill to the first step without the killed worker: %v", spread(heals))
	t.Logf("from a replacement's start to its first step: %v", spread(joins))
}

func killAndReplace(t *testing.T, run int) (heal, join time.Duration) {
	j := startJob(t, 300, elastic.WithJob("chaos"), elastic.WithMembers(3, 4))
	var ps []*proc
	for i := range 4 {
		ps = append(ps, j.start("worker:"+strconv.Itoa(i)))
	}
	victim, at := rand.IntN(4), int64(20+rand.IntN(200))
	j.waitFor("the step to kill at", func() bool { return j.lastStep() >= at })
	killed := time.Now()
	require.NoError(t, ps[victim].cmd.Process.Kill())
	repl := j.start(ps[victim].name)
	var rest []*proc
	for i, p := range ps {
		if i != victim {
			rest = append(rest, p)
		}
	}
	j.finished(append(rest, repl)...)
	j.mu.Lock()
	defer j.mu.Unlock()
	var ws *proc
	for _, p := range rest {
		if ws == nil || p.lines[0].Nanos < ws.lines[0].Nanos {
			ws = p
		}
	}
	healed, ok := first(rest[0], killed, func(l line) bool { return l.Event == "step" && l.Size < 4 || l.Event == "step" && l.Epoch > 1 })
	require.True(t, ok)
	joined, ok := first(repl, repl.started, func(l line) bool { return l.Event == "step" })
	require.True(t, ok)
	t.Logf("run %d: killed %s at step %d", run, ps[victim].name, at)
	return time.Duration(healed.Nanos - killed.UnixNano()), time.Duration(joined.Nanos - repl.started.UnixNano())
}

func spread(ds []time.Duration) string {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	return "median " + s[len(s)/2].Round(time.Millisecond).String() + ", worst " + s[len(s)-1].Round(time.Millisecond).String()
}

// TestScaleUpThenGracefulLeave grows a job of two workers to four, then
// one leaves on SIGTERM at a step boundary: nothing is lost or repeated,
// and the leaver exits cleanly without finishing.
func TestScaleUpThenGracefulLeave(t *testing.T) {
	j := startJob(t, 300, elastic.WithJob("chaos"), elastic.WithMembers(2, 4), elastic.WithSettle(0))
	a, b := j.start("worker:0"), j.start("worker:1")
	j.waitFor("step 50", func() bool { return j.lastStep() >= 50 })
	c, d := j.start("worker:2"), j.start("worker:3")
	j.waitFor("four members", func() bool {
		_, ok := first(a, time.Time{}, func(l line) bool { return l.Event == "step" && l.Size == 4 })
		return ok
	})
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	j.waitFor("the leaver to exit", func() bool { return c.exited })
	j.finished(a, b, d)
	j.mu.Lock()
	defer j.mu.Unlock()
	require.NoError(t, c.err)
	assert.NotEqual(t, "done", c.lines[len(c.lines)-1].Event, "the leaver finished instead of leaving")
	_, ok := first(a, time.Time{}, func(l line) bool { return l.Event == "step" && l.Size == 3 })
	assert.True(t, ok, "the group never went on with three")
}

// TestBelowMinimumStops: a job that loses a worker below its minimum
// waits for a joiner up to its wait timeout, then stops, naming who left.
func TestBelowMinimumStops(t *testing.T) {
	j := startJob(t, 100000, elastic.WithJob("chaos"), elastic.WithMembers(3, 3), elastic.WithWaitTimeout(time.Second))
	ps := []*proc{j.start("worker:0"), j.start("worker:1"), j.start("worker:2")}
	j.waitFor("step 30", func() bool { return j.lastStep() >= 30 })
	require.NoError(t, ps[2].cmd.Process.Kill())
	j.waitFor("the survivors to stop", func() bool { return ps[0].exited && ps[1].exited })
	var stop *elastic.StopError
	err := <-j.serve
	j.serve <- err
	require.True(t, errors.As(err, &stop), "Serve returned %v", err)
	require.Len(t, stop.Left, 1)
	assert.Equal(t, "worker:2", stop.Left[0].Name)
	assert.Equal(t, 2, stop.Have)
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range ps[:2] {
		last := p.lines[len(p.lines)-1]
		assert.Equal(t, "error", last.Event)
		assert.Contains(t, last.Err, "worker:2 left at")
		assert.Contains(t, last.Err, "2 of its minimum of 3")
	}
}
