package launch_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
)

// writeTrace is a shell command that writes a one-span trace, its span
// named after the task, where the launcher says.
const writeTrace = `printf '{"traceEvents":[{"name":"step-%s-%s","ph":"X","ts":1,"dur":2,"pid":0,"tid":0}],"displayTimeUnit":"ms"}' ` +
	`"$TFDIST_TASK_TYPE" "$TFDIST_TASK_INDEX" > "$TFDIST_TIMELINE"`

// runShell runs script with sh as every task of the cluster opts describe;
// the tasks find dir in LAUNCH_TEST_DIR. It returns the launcher's logs and
// the run's error.
func runShell(t *testing.T, dir, script string, opts ...launch.Option) (*observer.ObservedLogs, error) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	env := append(os.Environ(), "LAUNCH_TEST_DIR="+dir)
	base := []launch.Option{launch.WithEnv(env), launch.WithOutput(&strings.Builder{}, &strings.Builder{}),
		launch.WithLogger(zap.New(core)), launch.WithGracePeriod(2 * time.Second), launch.WithTimeout(testTimeout)}
	l, err := launch.New([]string{"sh", "-c", script}, append(base, opts...)...)
	require.NoError(t, err)
	return logs, l.Run(context.Background())
}

// traceEvents returns the spans of the trace in path, by process id.
func traceEvents(t *testing.T, path string) map[int][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var trace struct {
		TraceEvents []struct {
			Name string `json:"name"`
			PID  int    `json:"pid"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &trace), "%s", b)
	out := map[int][]string{}
	for _, e := range trace.TraceEvents {
		out[e.PID] = append(out[e.PID], e.Name)
	}
	return out
}

// Every task's trace ends up in the one file, a track per task in task
// order; a task that writes none is named in a warning but does not fail
// the run, and the tasks' own files are gone afterwards.
func TestTimelineMergesTheTasksTraces(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "trace.json"), t.TempDir()
	script := `echo "$TFDIST_TIMELINE" > "$LAUNCH_TEST_DIR/$TFDIST_TASK_TYPE-$TFDIST_TASK_INDEX"
if [ "$TFDIST_TASK_TYPE" = worker ]; then ` + writeTrace + `; fi`
	logs, err := runShell(t, dir, script, launch.WithChief(true), launch.WithWorkers(2), launch.WithTimeline(path))
	require.NoError(t, err)

	assert.Equal(t, map[int][]string{0: {"step-worker-0"}, 1: {"step-worker-1"}}, traceEvents(t, path))
	none := logs.FilterMessageSnippet("wrote no trace").All()
	require.Len(t, none, 1)
	assert.Equal(t, []any{"chief:0"}, none[0].ContextMap()["tasks"])
	assert.Equal(t, 1, logs.FilterMessageSnippet("timeline written").FilterField(zap.String("path", path)).Len())
	assert.Zero(t, logs.FilterMessageSnippet("left out").Len())

	traceDirs := map[string]bool{}
	for _, task := range []string{"chief-0", "worker-0", "worker-1"} {
		b, err := os.ReadFile(filepath.Join(dir, task))
		require.NoError(t, err)
		file := strings.TrimSpace(string(b))
		assert.Equal(t, task+".json", filepath.Base(file), "each task has a file of its own")
		traceDirs[filepath.Dir(file)] = true
	}
	require.Len(t, traceDirs, 1)
	for d := range traceDirs {
		assert.NoDirExists(t, d, "the tasks' traces are removed once merged")
	}
}

// A failed run still leaves its timeline, to see what led up to the
// failure.
func TestTimelineOfAFailedRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	// worker:1 fails once worker:0 has written its trace, lest it be
	// stopped before.
	script := writeTrace + `
if [ "$TFDIST_TASK_INDEX" = 0 ]; then touch "$LAUNCH_TEST_DIR/written"; exit 0; fi
while [ ! -e "$LAUNCH_TEST_DIR/written" ]; do sleep 0.02; done
exit 3`
	_, err := runShell(t, t.TempDir(), script, launch.WithWorkers(2), launch.WithTimeline(path))
	var te *launch.TaskError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, cluster.Task{Type: cluster.Worker, Index: 1}, te.Task)
	assert.Equal(t, map[int][]string{0: {"step-worker-0"}, 1: {"step-worker-1"}}, traceEvents(t, path))
}

// A run whose tasks wrote no trace leaves an existing file as it was.
func TestTimelineKeepsTheFileWhenNoTaskWroteATrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	require.NoError(t, os.WriteFile(path, []byte("an earlier run's"), 0o644))
	logs, err := runShell(t, t.TempDir(), "exit 3", launch.WithWorkers(2), launch.WithTimeline(path))
	var te *launch.TaskError
	require.ErrorAs(t, err, &te)
	b, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	assert.Equal(t, "an earlier run's", string(b))
	assert.Equal(t, 1, logs.FilterMessageSnippet("no timeline written").Len())
}

// A timeline file that cannot be written is an error naming it before any
// task starts, not after the training.
func TestTimelineUnwritableFailsBeforeAnyTaskStarts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for name, path := range map[string]string{
		"no such directory": filepath.Join(dir, "missing", "trace.json"),
		"parent is a file":  filepath.Join(file, "trace.json"),
		"a directory":       dir,
	} {
		t.Run(name, func(t *testing.T) {
			started := 0
			dir := t.TempDir()
			_, err := runShell(t, dir, `touch "$LAUNCH_TEST_DIR/ran"`, launch.WithWorkers(2), launch.WithTimeline(path),
				launch.WithOnStart(func(cluster.Task, int, int) { started++ }))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "timeline "+path+":")
			assert.Zero(t, started, "no task started")
			assert.NoFileExists(t, filepath.Join(dir, "ran"))
		})
	}
}
