package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With --ps, --task-restarts bounds the restarts of a worker that keeps
// exiting: launch says each restart, then exits with the worker's status
// and an error that names it and shows its last lines.
func TestLaunchTaskRestartsFlag(t *testing.T) {
	cmd, _, stderr := tfdist(t, nil, "launch", "--chief", "--workers", "2", "--ps", "1", "--task-restarts", "1",
		"--timeout", "60s", "--grace", "2s", "--",
		"sh", "-c", `if [ "$TFDIST_TASK_TYPE:$TFDIST_TASK_INDEX" = worker:1 ]; then echo "no luck, run $TFDIST_RESTART"; exit 6; fi; exec sleep 60`)
	require.Equal(t, 6, exitCode(t, cmd, 60*time.Second), "launch exits with the worker's status\nstderr: %s", stderr)
	out := stderr.String()
	assert.Equal(t, 1, strings.Count(out, "restarting it at the same address"), out)
	assert.Contains(t, out, "tfdist launch: worker:1 exited with status 6 while the chief was running, and is not restarted again: "+
		"the limit is 1 restart per task (--task-restarts) (after 1 restart); its last lines:\n\tno luck, run 1\n")
}

func TestLaunchTaskRestartsMustNotBeNegative(t *testing.T) {
	code, _, stderr := runHere(nil, "", "launch", "--chief", "--ps", "1", "--task-restarts", "-1", "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "task restarts: -1, expected >= 0")
}

// --timeline leaves one trace of every task that wrote one, and says where.
func TestLaunchTimelineFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	code, _, stderr := runHere(nil, "", "launch", "--workers", "2", "--timeline", path, "--timeout", "60s", "--",
		"sh", "-c", `printf '{"traceEvents":[{"name":"step","ph":"X","ts":1,"dur":2,"pid":0,"tid":0}],"displayTimeUnit":"ms"}' > "$TFDIST_TIMELINE"`)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "timeline written")
	assert.Contains(t, stderr, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var trace struct {
		TraceEvents []struct{ PID int } `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &trace))
	require.Len(t, trace.TraceEvents, 2)
	assert.ElementsMatch(t, []int{0, 1}, []int{trace.TraceEvents[0].PID, trace.TraceEvents[1].PID})
}

func TestLaunchTimelineUnwritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "trace.json")
	code, stdout, stderr := runHere(nil, "", "launch", "--timeline", path, "--", "echo", "ran")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "tfdist launch: timeline "+path+": cannot be written")
	assert.NotContains(t, stdout, "ran")
}

// --metrics prints, for each task, the URL of the address it was given.
func TestLaunchMetricsFlag(t *testing.T) {
	code, stdout, stderr := runHere(nil, "", "launch", "--workers", "2", "--metrics", "--timeout", "60s", "--",
		"sh", "-c", `echo "addr=$TFDIST_METRICS_ADDR"`)
	require.Equal(t, 0, code, stderr)
	addrs := regexp.MustCompile(`(?m)^\[(worker:\d)\] addr=(127\.0\.0\.1:\d+)$`).FindAllStringSubmatch(stdout, -1)
	require.Len(t, addrs, 2, stdout)
	assert.NotEqual(t, addrs[0][2], addrs[1][2])
	for _, a := range addrs {
		assert.Regexp(t, `"task": "`+a[1]+`", "url": "http://`+regexp.QuoteMeta(a[2])+`/metrics"`, stderr)
	}
}

// A 2-worker job under --timeline leaves one Chrome trace with a track
// per worker on one clock: each collective runs at the same time on both,
// and each step's input and compute add up to the step within 5%. Launch
// prints each task's breakdown, and each worker's -json line carries its
// own.
func TestLaunchTimelineOfATwoWorkerJob(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	cmd, stdout, stderr := tfdist(t, nil, "launch", "--workers", "2", "--timeline", path, "--timeout", "150s", "--",
		os.Args[0], "demo", "-strategy", "multiworker", "-steps", "40", "-json")
	require.Equal(t, 0, exitCode(t, cmd, 180*time.Second), "stderr: %s", stderr)
	assert.Contains(t, stderr.String(), "Where each task's time went")
	assert.Regexp(t, `(?m)^\s*worker:1\s+\d`, stderr.String(), "a row per task")
	assert.Equal(t, 2, strings.Count(stdout.String(), `"breakdown":{"wall_ns"`), stdout)

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var trace struct {
		TraceEvents []struct {
			Name, Cat, Ph string
			TS, Dur       float64
			PID           int
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &trace), "Chrome trace JSON")
	type span struct{ start, end float64 }
	steps := map[int][]span{}
	parts := map[int][]span{}
	collectives := map[int]map[string]span{0: {}, 1: {}}
	for _, e := range trace.TraceEvents {
		s := span{e.TS, e.TS + e.Dur}
		switch e.Cat {
		case "step":
			steps[e.PID] = append(steps[e.PID], s)
		case "input", "compute":
			parts[e.PID] = append(parts[e.PID], s)
		case "collective":
			collectives[e.PID][e.Name] = s
		}
	}
	for pid := range 2 {
		require.GreaterOrEqual(t, len(steps[pid]), 40, "task %d: a span per step, the evaluation's after the 40 training steps", pid)
		for i, st := range steps[pid] {
			sum := 0.0
			for _, p := range parts[pid] {
				if p.start >= st.start-1 && p.end <= st.end+1 { // µs, rounded
					sum += p.end - p.start
				}
			}
			assert.InEpsilon(t, st.end-st.start, sum, 0.05, "task %d, step %d", pid, i+1)
		}
	}
	require.NotEmpty(t, collectives[0])
	for name, a := range collectives[0] {
		if b, ok := collectives[1][name]; ok {
			assert.True(t, a.start <= b.end && b.start <= a.end, "%s runs at the same time on both tasks: one clock", name)
		}
	}
}
