package launch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
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

// starts records what WithOnStart reports.
type starts struct {
	mu  sync.Mutex
	all []start
}

type start struct {
	task    cluster.Task
	attempt int
	pid     int
	at      time.Time
}

func (s *starts) add(t cluster.Task, attempt, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, start{t, attempt, pid, time.Now()})
}

// of returns the starts of task t, in order.
func (s *starts) of(t cluster.Task) []start {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []start
	for _, st := range s.all {
		if st.task == t {
			out = append(out, st)
		}
	}
	return out
}

// pids returns the process id of every start, in order.
func (s *starts) pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, st := range s.all {
		out = append(out, st.pid)
	}
	return out
}

func attempts(ss []start) []int {
	var out []int
	for _, s := range ss {
		out = append(out, s.attempt)
	}
	return out
}

// scriptRun is a run of a shell script as every task.
type scriptRun struct {
	stdout, stderr bytes.Buffer
	dir            string
	starts         starts
	logs           *observer.ObservedLogs
	err            error
	took           time.Duration
}

// scriptTimeout is the launcher's timeout in runScript: what a run that
// waited for its sleeping tasks (600 s) would take. A run that must end
// them rather than wait is checked to take less than half of it, so that
// only waiting fails the check, not a loaded machine.
const scriptTimeout = 4 * time.Minute

// runScript runs script under sh as every task of the cluster opts
// describe, with $DIR a temporary directory, a short grace period, a timeout
// (scriptTimeout) that bounds the test, and a logger the test reads.
func runScript(t *testing.T, script string, opts ...launch.Option) *scriptRun {
	t.Helper()
	r := &scriptRun{dir: t.TempDir()}
	core, logs := observer.New(zapcore.InfoLevel)
	r.logs = logs
	base := []launch.Option{launch.WithEnv(append(os.Environ(), "DIR="+r.dir)), launch.WithOutput(&r.stdout, &r.stderr),
		launch.WithGracePeriod(2 * time.Second), launch.WithTimeout(scriptTimeout),
		launch.WithLogger(zap.New(core)), launch.WithOnStart(r.starts.add)}
	l, err := launch.New([]string{"sh", "-c", script}, append(base, opts...)...)
	require.NoError(t, err)
	begin := time.Now()
	r.err = l.Run(context.Background())
	r.took = time.Since(begin)
	return r
}

// restartLogs returns the launcher's restart messages: for each, the task,
// the restart number, the exit status and the delay.
func (r *scriptRun) restartLogs() []string {
	var out []string
	for _, e := range r.logs.FilterMessageSnippet("restarting it").AllUntimed() {
		f := e.ContextMap()
		out = append(out, fmt.Sprintf("%v restart %v after %v in %v", f["task"], f["restart"], f["status"], f["delay"]))
	}
	return out
}

// assertNoLaunchGoroutines checks that nothing of the launch package still
// runs: no pump, waiter or restart timer outlives Run.
func assertNoLaunchGoroutines(t *testing.T) {
	t.Helper()
	var stacks string
	assert.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "/cmd/tfdist/internal/launch.")
	}, 30*time.Second, 20*time.Millisecond, "goroutines of the launch package outlive Run:\n%s", stacks)
}

var (
	worker0 = cluster.Task{Type: cluster.Worker, Index: 0}
	worker1 = cluster.Task{Type: cluster.Worker, Index: 1}
)

// A worker of a parameter-server cluster that dies is started again with
// the same TF_CONFIG (so at the address its predecessor had, where the
// chief's coordinator looks for it) and TFDIST_RESTART=1; what it had
// started is gone before it restarts, its unfinished last line is ended
// before the new process writes, and the run succeeds with the chief.
func TestParameterServerWorkerIsRestartedAtItsAddress(t *testing.T) {
	script := `
case "$TFDIST_TASK_TYPE:$TFDIST_TASK_INDEX:$TFDIST_RESTART" in
chief:*)
	for i in $(seq 600); do [ -e "$DIR/back" ] && { echo "coordinator done"; exit 0; }; sleep 0.1; done
	exit 9 ;;
worker:0:0)
	echo "config $TF_CONFIG"
	sleep 600 & echo $! > "$DIR/child"
	printf 'dying mid-line'
	exit 1 ;;
worker:0:*)
	echo "config $TF_CONFIG"
	echo "restart $TFDIST_RESTART"
	state=$(cut -d' ' -f3 "/proc/$(cat "$DIR/child")/stat" 2>/dev/null)
	[ -z "$state" ] || [ "$state" = Z ] && echo "no child left"
	touch "$DIR/back"
	exec sleep 600 ;;
*)
	exec sleep 600 ;;
esac`
	r := runScript(t, script, launch.WithChief(true), launch.WithWorkers(2), launch.WithPS(1),
		launch.WithRestartBackoff(200*time.Millisecond, time.Second))
	require.NoError(t, r.err, "stdout:\n%s\nstderr:\n%s", &r.stdout, &r.stderr)
	out := r.stdout.String()

	configs := regexp.MustCompile(`(?m)^\[worker:0\] config (.*)$`).FindAllStringSubmatch(out, -1)
	require.Len(t, configs, 2, out)
	assert.Equal(t, configs[0][1], configs[1][1], "the restarted worker is given the same cluster and task")
	var cfg struct {
		Cluster map[string][]string `json:"cluster"`
	}
	require.NoError(t, json.Unmarshal([]byte(configs[1][1]), &cfg))
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, cfg.Cluster["worker"][0])

	assert.Contains(t, out, "[worker:0] dying mid-line\n[worker:0] ", "the dead worker's last line is ended, the new one's prefixed")
	assert.Contains(t, out, "[worker:0] restart 1\n")
	assert.Contains(t, out, "[worker:0] no child left\n", "what the dead worker started was killed before the restart")
	assert.Contains(t, out, "[chief:0] coordinator done")
	assert.Equal(t, []int{0, 1}, attempts(r.starts.of(worker0)), "WithOnStart reports the restart")
	assert.Equal(t, []int{0}, attempts(r.starts.of(worker1)))
	assert.Equal(t, []string{"worker:0 restart 1 after exit status 1 in 200ms"}, r.restartLogs())
	assert.Less(t, r.took, scriptTimeout/2, "the servers are ended with the chief, not waited for until the %v timeout", scriptTimeout)
	assertAllGone(t, r.starts.pids())
	assertNoLaunchGoroutines(t)
}

// A worker that fails at every start is restarted exactly as many times as
// allowed, each time after a longer delay; then the run fails with a
// *TaskError that names it, carries its status, and ends with its last
// lines, and launch exits with its status.
func TestParameterServerWorkerThatKeepsFailingEndsTheRun(t *testing.T) {
	script := `
case "$TFDIST_TASK_TYPE:$TFDIST_TASK_INDEX" in
worker:1)
	for i in $(seq 30); do echo "start-up line $i"; done
	echo "cannot serve (start $TFDIST_RESTART)" >&2
	exit 7 ;;
*)
	exec sleep 600 ;;
esac`
	r := runScript(t, script, launch.WithChief(true), launch.WithWorkers(2), launch.WithPS(1),
		launch.WithTaskRestarts(3), launch.WithRestartBackoff(100*time.Millisecond, 10*time.Second))

	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, worker1, te.Task)
	assert.Equal(t, 7, te.ExitCode)
	assert.Equal(t, 3, te.Attempt)
	assert.Equal(t, 7, launch.ExitCode(r.err), "the launcher exits with the worker's status")
	msg := r.err.Error()
	assert.Contains(t, msg, "worker:1 exited with status 7")
	assert.Contains(t, msg, "the limit is 3 restarts per task")
	// The last 10 lines of each stream, merged in the order they were read:
	// a burst on stdout does not push out the error on stderr.
	require.Len(t, te.Output, 11, "its last lines")
	assert.Contains(t, te.Output, "cannot serve (start 3)", "its stderr")
	var stdout []string
	for i := 21; i <= 30; i++ {
		stdout = append(stdout, fmt.Sprintf("start-up line %d", i))
	}
	assert.Equal(t, stdout, slices.DeleteFunc(slices.Clone(te.Output), func(l string) bool {
		return strings.HasPrefix(l, "cannot")
	}), "its stdout, to the end")
	assert.Contains(t, msg, "; its last lines:\n\t")
	assert.Contains(t, msg, "\n\tcannot serve (start 3)")
	assert.Contains(t, msg, "\n\tstart-up line 30")

	starts := r.starts.of(worker1)
	require.Equal(t, []int{0, 1, 2, 3}, attempts(starts), "started once, restarted 3 times")
	assert.Equal(t, []string{
		"worker:1 restart 1 after exit status 7 in 100ms",
		"worker:1 restart 2 after exit status 7 in 200ms",
		"worker:1 restart 3 after exit status 7 in 400ms",
	}, r.restartLogs())
	for i, want := range []time.Duration{100, 200, 400} {
		gap := starts[i+1].at.Sub(starts[i].at)
		assert.GreaterOrEqual(t, gap, want*time.Millisecond, "restart %d waited its delay", i+1)
	}
	assert.Equal(t, []int{0}, attempts(r.starts.of(worker0)), "the healthy worker is left alone")
	assert.Equal(t, 1, strings.Count(r.stderr.String(), "[worker:1] cannot serve (start 3)"))
	assertAllGone(t, r.starts.pids())
	assertNoLaunchGoroutines(t)
}

// A chief that finishes while a dead worker waits for its restart ends the
// run at once: the restart is called off, not waited for.
func TestChiefEndingCancelsAPendingRestart(t *testing.T) {
	const restartDelay = 2 * time.Minute // within scriptTimeout
	script := `
case "$TFDIST_TASK_TYPE" in
chief) sleep 1; exit 0 ;;
worker) exit 1 ;;
*) exec sleep 600 ;;
esac`
	r := runScript(t, script, launch.WithChief(true), launch.WithWorkers(1), launch.WithPS(1),
		launch.WithRestartBackoff(restartDelay, restartDelay))
	require.NoError(t, r.err)
	assert.Less(t, r.took, restartDelay/2, "the %v restart delay is not waited for", restartDelay)
	assert.Equal(t, []int{0}, attempts(r.starts.of(worker0)))
	assertNoLaunchGoroutines(t)
}

// Outside parameter-server clusters a task is never restarted on its own:
// a failure ends the attempt, and WithMaxRestarts starts every task again.
func TestNoTaskRestartsOutsideParameterServerClusters(t *testing.T) {
	script := `
if [ "$TFDIST_TASK_INDEX:$TFDIST_RESTART" = 1:0 ]; then exit 5; fi
[ "$TFDIST_TASK_INDEX" = 0 ] && [ "$TFDIST_RESTART" = 0 ] && exec sleep 600
echo "attempt $TFDIST_RESTART ok"`
	r := runScript(t, script, launch.WithWorkers(2), launch.WithTaskRestarts(3))
	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, worker1, te.Task)
	assert.Equal(t, 5, launch.ExitCode(r.err))
	assert.Equal(t, []int{0}, attempts(r.starts.of(worker1)), "not restarted alone")
	assert.Empty(t, r.restartLogs())

	r = runScript(t, script, launch.WithWorkers(2), launch.WithTaskRestarts(3), launch.WithMaxRestarts(1))
	require.NoError(t, r.err)
	assert.Equal(t, []int{0, 1}, attempts(r.starts.of(worker0)), "the whole cluster restarts")
	assert.Equal(t, []int{0, 1}, attempts(r.starts.of(worker1)))
	assert.Contains(t, r.stdout.String(), "[worker:0] attempt 1 ok")
	assert.Empty(t, r.restartLogs())
	assertNoLaunchGoroutines(t)
}

// A ps task that dies is not restarted, whatever WithTaskRestarts allows:
// the run fails and says why.
func TestParameterServerPSIsNotRestarted(t *testing.T) {
	script := `
case "$TFDIST_TASK_TYPE" in
ps) echo "ps going down"; exit 0 ;;
*) exec sleep 600 ;;
esac`
	r := runScript(t, script, launch.WithChief(true), launch.WithWorkers(1), launch.WithPS(1), launch.WithTaskRestarts(5))
	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, cluster.Task{Type: cluster.PS}, te.Task)
	assert.Equal(t, 1, launch.ExitCode(r.err), "a ps task that exits, even with 0, fails the run")
	assert.Contains(t, r.err.Error(), "held its variables in memory only")
	assert.Contains(t, r.err.Error(), "ps going down")
	assert.Equal(t, []int{0}, attempts(r.starts.of(cluster.Task{Type: cluster.PS})))
	assertNoLaunchGoroutines(t)
}

// TFDIST_RESTART counts a task's restarts of both kinds: a worker restarted
// alone in the second run of the cluster is told 2.
func TestRestartCountsBothKinds(t *testing.T) {
	script := `
case "$TFDIST_TASK_TYPE:$TFDIST_RESTART" in
chief:0) exit 4 ;;
chief:*)
	for i in $(seq 600); do [ -e "$DIR/back" ] && exit 0; sleep 0.1; done
	exit 9 ;;
worker:1) exit 1 ;;
worker:2) touch "$DIR/back"; exec sleep 600 ;;
*) exec sleep 600 ;;
esac`
	r := runScript(t, script, launch.WithChief(true), launch.WithWorkers(1), launch.WithPS(1), launch.WithMaxRestarts(1),
		launch.WithRestartBackoff(50*time.Millisecond, 50*time.Millisecond))
	require.NoError(t, r.err, "stderr:\n%s", &r.stderr)
	assert.Equal(t, []int{0, 1, 2}, attempts(r.starts.of(worker0)))
	assert.Equal(t, []int{0, 1}, attempts(r.starts.of(cluster.Task{Type: cluster.Chief})))
	assertNoLaunchGoroutines(t)
}

func TestRestartOptionsAreChecked(t *testing.T) {
	for _, c := range []struct {
		opt  launch.Option
		want string
	}{
		{launch.WithTaskRestarts(-1), "task restarts: -1, expected >= 0"},
		{launch.WithRestartBackoff(0, time.Second), "restart backoff: 0s to 1s, expected 0 < initial <= limit"},
		{launch.WithRestartBackoff(2*time.Second, time.Second), "restart backoff: 2s to 1s"},
	} {
		_, err := launch.New([]string{"true"}, c.opt)
		assert.ErrorContains(t, err, c.want)
	}
	_, err := launch.New([]string{"true"}, launch.WithTaskRestarts(0), launch.WithRestartBackoff(time.Second, time.Second))
	assert.NoError(t, err)
}
