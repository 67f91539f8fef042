package timeline_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/timeline"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func span(p timeline.Phase, from, to int) timeline.Span {
	return timeline.Span{Phase: p, Name: string(p), Start: at(from), End: at(to)}
}

// A recorder keeps the most recent spans up to its capacity, oldest
// first, and counts the ones it dropped: a long run's timeline is bounded.
func TestRecorderKeepsABoundedWindow(t *testing.T) {
	r := timeline.New(3)
	for i := range 5 {
		r.Add(span(timeline.Compute, i, i+1))
	}
	spans, dropped := r.Spans()
	require.Len(t, spans, 3)
	assert.EqualValues(t, 2, dropped)
	for i, s := range spans {
		assert.Equal(t, at(i+2), s.Start, "span %d", i)
	}

	var nilRec *timeline.Recorder
	nilRec.Add(span(timeline.Input, 0, 1))
	nilRec.Begin(timeline.Input, "x")(nil)
	got, _ := nilRec.Spans()
	assert.Empty(t, got, "a nil recorder records nothing")
}

// Spans recorded from many goroutines at once are all kept.
func TestRecorderIsSafeForConcurrentUse(t *testing.T) {
	r := timeline.New(0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				r.Begin(timeline.Collective, fmt.Sprintf("allreduce_%d_%d", g, i))(map[string]any{"bytes": i})
			}
		}()
	}
	wg.Wait()
	spans, dropped := r.Spans()
	assert.Len(t, spans, 800)
	assert.Zero(t, dropped)
}

// Two tasks' traces merge into one Chrome trace with a track per task,
// named, on the tasks' common clock, with every span's phase, length and
// arguments.
func TestTracesMergeIntoOneChromeTrace(t *testing.T) {
	var files []io.Reader
	for task := range 2 {
		r := timeline.New(0)
		r.Add(span(timeline.Input, 0, 2))
		r.Add(timeline.Span{Phase: timeline.Collective, Name: "allreduce_1", Start: at(5 + task), End: at(9), Lane: 1,
			Args: map[string]any{"bytes": 4096}})
		var b bytes.Buffer
		require.NoError(t, timeline.Write(&b, r, fmt.Sprintf("worker:%d", task), 0))
		files = append(files, &b)
	}
	var merged bytes.Buffer
	require.NoError(t, timeline.Merge(&merged, files...))

	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Ph   string         `json:"ph"`
			TS   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			PID  int            `json:"pid"`
			TID  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(merged.Bytes(), &tr))
	require.Len(t, tr.TraceEvents, 14, "per task: its name, two spans, and its two lanes' names and places")
	names := map[int]string{}
	lanes := map[[2]int]string{}
	for _, e := range tr.TraceEvents {
		if e.Ph == "M" && e.Name == "process_name" {
			names[e.PID] = e.Args["name"].(string)
			continue
		}
		if e.Ph == "M" && e.Name == "thread_name" {
			lanes[[2]int{e.PID, e.TID}] = e.Args["name"].(string)
			continue
		}
		if e.Ph == "M" {
			assert.EqualValues(t, e.TID, e.Args["sort_index"], "lanes in order, steps first")
			continue
		}
		assert.Equal(t, "X", e.Ph)
		if e.Cat == "collective" {
			assert.InDelta(t, float64(at(5+e.PID).UnixMicro()), e.TS, 1, "task %d's start on the common clock", e.PID)
			assert.InDelta(t, float64((4-e.PID)*1000), e.Dur, 1e-6)
			assert.Equal(t, 1, e.TID)
			assert.EqualValues(t, 4096, e.Args["bytes"])
		}
	}
	assert.Equal(t, map[int]string{0: "worker:0", 1: "worker:1"}, names)
	assert.Equal(t, map[[2]int]string{{0, 0}: "steps", {0, 1}: "collectives 1", {1, 0}: "steps", {1, 1}: "collectives 1"}, lanes)
}

// A span inside another stays inside it on the trace, however their
// times fall between microseconds: viewers draw a span that ends after
// its parent on a row of its own.
func TestNestedSpansStayNested(t *testing.T) {
	r := timeline.New(0)
	for i := range 1000 {
		base := t0.Add(time.Duration(i) * 7777 * time.Nanosecond)
		r.Add(timeline.Span{Phase: timeline.Step, Start: base.Add(300), End: base.Add(10_650)})
		r.Add(timeline.Span{Phase: timeline.Compute, Start: base.Add(5_210), End: base.Add(10_650)})
	}
	var b bytes.Buffer
	require.NoError(t, timeline.Write(&b, r, "worker:0", 0))
	var tr struct {
		TraceEvents []struct {
			Cat     string
			TS, Dur float64
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &tr))
	var step struct{ TS, Dur float64 }
	for _, e := range tr.TraceEvents {
		switch e.Cat {
		case "step":
			step.TS, step.Dur = e.TS, e.Dur
		case "compute":
			assert.GreaterOrEqual(t, e.TS, step.TS)
			assert.LessOrEqual(t, e.TS+e.Dur, step.TS+step.Dur)
		}
	}
}

// A window's wall time splits into its phases: overlapping spans of a
// phase count once, idle is what no span covers, and the collective time
// that compute covered counts as overlapped.
func TestBreakdown(t *testing.T) {
	b := timeline.Summarize([]timeline.Span{
		span(timeline.Input, 0, 10),
		span(timeline.Compute, 10, 60),
		span(timeline.Collective, 40, 70),
		span(timeline.Collective, 50, 65), // overlaps the one before
		span(timeline.Input, 80, 100),
	})
	assert.Equal(t, 100*time.Millisecond, b.Wall)
	assert.InDelta(t, 0.30, b.Share[timeline.Input], 1e-9)
	assert.InDelta(t, 0.50, b.Share[timeline.Compute], 1e-9)
	assert.InDelta(t, 0.30, b.Share[timeline.Collective], 1e-9)
	assert.InDelta(t, 0.10, b.Idle, 1e-9, "70..80 ms")
	assert.InDelta(t, 20.0/30, b.Overlapped, 1e-9, "40..60 of 40..70")
	assert.Equal(t, timeline.Breakdown{Share: map[timeline.Phase]float64{}}, timeline.Summarize(nil))
}

// A merged trace's breakdown, read back per task, is each task's own
// Summarize, and the table shows a row per task with its shares.
func TestBreakdownsOfAMergedTrace(t *testing.T) {
	var files []io.Reader
	want := map[string]timeline.Breakdown{}
	for task := range 2 {
		r := timeline.New(0)
		r.Add(span(timeline.Input, 0, 2+task))
		r.Add(span(timeline.Compute, 4, 10))
		r.Add(span(timeline.Collective, 8, 12))
		var b bytes.Buffer
		name := fmt.Sprintf("worker:%d", task)
		require.NoError(t, timeline.Write(&b, r, name, 0))
		files = append(files, &b)
		spans, _ := r.Spans()
		want[name] = timeline.Summarize(spans)
	}
	var merged bytes.Buffer
	require.NoError(t, timeline.Merge(&merged, files...))
	got, err := timeline.Breakdowns(bytes.NewReader(merged.Bytes()))
	require.NoError(t, err)
	require.Len(t, got, 2)
	for name, w := range want {
		assert.Equal(t, w.Wall, got[name].Wall, name)
		assert.InDelta(t, w.Share[timeline.Input], got[name].Share[timeline.Input], 1e-6, name)
		assert.InDelta(t, w.Overlapped, got[name].Overlapped, 1e-6, name)
	}
	assert.InDelta(t, 0.25, got["worker:1"].Share[timeline.Input], 1e-6, "3 ms of 12")
	assert.InDelta(t, 0.5, got["worker:1"].Overlapped, 1e-6, "2 ms of the collective's 4 under compute")

	var file struct {
		OtherData map[string]json.RawMessage `json:"otherData"`
	}
	require.NoError(t, json.Unmarshal(merged.Bytes(), &file))
	assert.Contains(t, string(file.OtherData["breakdown"]), `"worker:1"`, "the breakdown is in the trace's JSON")

	var table bytes.Buffer
	require.NoError(t, timeline.WriteTable(&table, got))
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	require.Len(t, lines, 3, "a header and a row per task")
	assert.Contains(t, lines[2], "worker:1")
	assert.Contains(t, lines[2], "25.0%")
}
