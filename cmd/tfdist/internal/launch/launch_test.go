package launch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
)

// The test binary doubles as the program the launcher runs: with
// LAUNCH_TEST_HELPER set it plays one of the roles of helper.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCH_TEST_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

func helper(mode string) int {
	if mode == "elastic" {
		return elasticWorker()
	}
	cfg, err := cluster.LoadTFConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 90
	}
	me := cfg.Task.String()
	restart := os.Getenv(launch.EnvRestart)
	// recordPIDs writes this process's pid and a child's, so that the test
	// can check that neither outlives the launcher.
	recordPIDs := func() {
		child := exec.Command("sleep", "600")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(91)
		}
		pids := fmt.Sprintf("%d %d", os.Getpid(), child.Process.Pid)
		path := filepath.Join(os.Getenv("LAUNCH_TEST_DIR"), me+".pids")
		if err := os.WriteFile(path+".tmp", []byte(pids), 0o644); err != nil || os.Rename(path+".tmp", path) != nil {
			os.Exit(92)
		}
	}
	// forever outlasts the launcher's timeout in every test.
	forever := func() int { time.Sleep(10 * time.Minute); return 93 }
	// othersRecorded waits (a minute at most, as waitPIDs does) until every
	// other task has recorded its pids, so that a task that ends the run
	// does so only once the test can see them all.
	othersRecorded := func() {
		n := cfg.Cluster.NumTasks(cluster.Chief) + cfg.Cluster.NumTasks(cluster.Worker) + cfg.Cluster.NumTasks(cluster.PS) - 1
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if files, _ := filepath.Glob(filepath.Join(os.Getenv("LAUNCH_TEST_DIR"), "*.pids")); len(files) >= n {
				return
			}
		}
	}
	switch mode {
	case "print":
		addr, _ := cfg.Cluster.TaskAddress(cfg.Task.Type, cfg.Task.Index)
		fmt.Printf("task=%s env=%s:%s restart=%s chief=%v fingerprint=%s addr=%s\n", me,
			os.Getenv(launch.EnvTaskType), os.Getenv(launch.EnvTaskIndex), restart, cfg.IsChief(),
			cfg.Cluster.Fingerprint(), addr)
		fmt.Printf("cluster=%s\n", cfg.Cluster)
		fmt.Printf("arenas=%s\n", os.Getenv(launch.EnvMallocArenaMax))
		fmt.Printf("log level=%s\n", os.Getenv(launch.EnvLogLevel))
		fmt.Fprintf(os.Stderr, "to stderr from %s\n", me)
		fmt.Print("no newline at the end")
		return 0
	case "fail":
		if me == os.Getenv("LAUNCH_TEST_FAIL") {
			othersRecorded()
			fmt.Println("failing on purpose")
			return 3
		}
		recordPIDs()
		return forever()
	case "flaky":
		if restart == "0" && me == "worker:1" {
			return 5
		}
		fmt.Printf("attempt %s ok\n", restart)
		return 0
	case "sleep":
		recordPIDs()
		return forever()
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		recordPIDs()
		return forever()
	case "ps":
		if cfg.Task.Type == cluster.Chief {
			othersRecorded()
			code, _ := strconv.Atoi(os.Getenv("LAUNCH_TEST_CHIEF_CODE"))
			fmt.Println("coordinator done")
			return code
		}
		recordPIDs()
		return forever()
	case "ps-exits":
		if cfg.Task.Type == cluster.PS {
			time.Sleep(200 * time.Millisecond)
			return 0
		}
		if cfg.Task.Type == cluster.Worker {
			return 7 // a worker lost: restarted, after a delay
		}
		recordPIDs()
		return forever()
	}
	return 94
}

type run struct {
	stdout, stderr bytes.Buffer
	dir            string
	err            error
	took           time.Duration
}

// testTimeout is the launcher's timeout in the tests: what a run that
// waited for tasks that never end would take. A run that must stop its
// tasks rather than wait for them is checked to take less than half of it,
// so that only waiting fails the check, not a loaded machine.
const testTimeout = 2 * time.Minute

// newLauncher returns a launcher that runs the test binary in mode, with a
// short grace period and a timeout, testTimeout, that bounds every test.
func newLauncher(t *testing.T, mode string, r *run, extraEnv []string, opts ...launch.Option) *launch.Launcher {
	t.Helper()
	r.dir = t.TempDir()
	env := append(os.Environ(), "LAUNCH_TEST_HELPER="+mode, "LAUNCH_TEST_DIR="+r.dir)
	env = append(env, extraEnv...)
	base := []launch.Option{launch.WithEnv(env), launch.WithOutput(&r.stdout, &r.stderr),
		launch.WithGracePeriod(2 * time.Second), launch.WithTimeout(testTimeout)}
	l, err := launch.New([]string{os.Args[0], "-test.run=^$"}, append(base, opts...)...)
	require.NoError(t, err)
	return l
}

func (r *run) run(l *launch.Launcher) {
	start := time.Now()
	r.err = l.Run(context.Background())
	r.took = time.Since(start)
}

// waitPIDs waits until n tasks have recorded their pids and returns them.
func waitPIDs(t *testing.T, dir string, n int) []int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pids"))
		if len(files) >= n {
			var pids []int
			for _, f := range files {
				b, err := os.ReadFile(f)
				require.NoError(t, err)
				for _, s := range strings.Fields(string(b)) {
					p, err := strconv.Atoi(s)
					require.NoError(t, err)
					pids = append(pids, p)
				}
			}
			return pids
		}
		require.True(t, time.Now().Before(deadline), "only %d of %d tasks started", len(files), n)
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func assertAllGone(t *testing.T, pids []int) {
	t.Helper()
	// Orphaned grandchildren are reaped by init at its own pace.
	assert.Eventually(t, func() bool {
		for _, p := range pids {
			if alive(p) {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "processes left running: %v", pids)
}

var lineRE = regexp.MustCompile(`(?m)^\[(\w+:\d+)\] task=(\S+) env=(\S+) restart=(\d+) chief=(\w+) fingerprint=(\w+) addr=(\S+)$`)

func TestEveryTaskSeesTheClusterAndItself(t *testing.T) {
	var r run
	l := newLauncher(t, "print", &r, nil, launch.WithWorkers(2), launch.WithChief(true))
	r.run(l)
	require.NoError(t, r.err, "stderr: %s", r.stderr.String())

	matches := lineRE.FindAllStringSubmatch(r.stdout.String(), -1)
	require.Len(t, matches, 3, "stdout: %s", r.stdout.String())
	fingerprints := map[string]bool{}
	addrs := map[string]bool{}
	var tasks []string
	for _, m := range matches {
		prefix, task, env, restart, chief, fp, addr := m[1], m[2], m[3], m[4], m[5], m[6], m[7]
		assert.Equal(t, prefix, task, "the prefix names the task that wrote the line")
		assert.Equal(t, task, env, "TFDIST_TASK_TYPE/INDEX agree with TF_CONFIG")
		assert.Equal(t, "0", restart)
		assert.Equal(t, task == "chief:0", chief == "true", task)
		assert.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)
		fingerprints[fp] = true
		addrs[addr] = true
		tasks = append(tasks, task)
	}
	sort.Strings(tasks)
	assert.Equal(t, []string{"chief:0", "worker:0", "worker:1"}, tasks)
	assert.Len(t, fingerprints, 1, "every task sees the same cluster")
	assert.Len(t, addrs, 3, "every task has its own port")

	// Every line of both streams carries its task, also a last line
	// without a newline.
	for _, line := range strings.Split(strings.TrimSuffix(r.stdout.String(), "\n"), "\n") {
		assert.Regexp(t, `^\[(chief|worker):\d\] `, line)
	}
	assert.Contains(t, r.stdout.String(), "[worker:1] no newline at the end\n")
	assert.Contains(t, r.stderr.String(), "[worker:1] to stderr from worker:1\n")
	assert.NotContains(t, r.stdout.String(), "to stderr")
}

func TestAFailingTaskStopsTheOthers(t *testing.T) {
	var r run
	l := newLauncher(t, "fail", &r, []string{"LAUNCH_TEST_FAIL=worker:1"}, launch.WithWorkers(3))
	done := make(chan struct{})
	go func() { r.run(l); close(done) }()
	pids := waitPIDs(t, r.dir, 2)
	<-done

	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, cluster.Task{Type: cluster.Worker, Index: 1}, te.Task)
	assert.Equal(t, 3, te.ExitCode)
	assert.Equal(t, 3, launch.ExitCode(r.err), "the launcher exits with the task's status")
	assert.Contains(t, r.err.Error(), "worker:1 exited with status 3")
	assert.Less(t, r.took, testTimeout/2, "the others are stopped promptly, not waited for until the %v timeout", testTimeout)
	assert.Contains(t, r.stdout.String(), "[worker:1] failing on purpose")
	assertAllGone(t, pids)
}

func TestMaxRestartsRerunsTheGroup(t *testing.T) {
	var r run
	l := newLauncher(t, "flaky", &r, nil, launch.WithWorkers(2), launch.WithMaxRestarts(1))
	r.run(l)
	require.NoError(t, r.err, "the second attempt succeeds")
	out := r.stdout.String()
	assert.Contains(t, out, "[worker:0] attempt 1 ok")
	assert.Contains(t, out, "[worker:1] attempt 1 ok")
	assert.NotContains(t, out, "[worker:1] attempt 0 ok")

	// Without restarts the same program fails.
	var r2 run
	l = newLauncher(t, "flaky", &r2, nil, launch.WithWorkers(2))
	r2.run(l)
	var te *launch.TaskError
	require.ErrorAs(t, r2.err, &te)
	assert.Equal(t, 5, launch.ExitCode(r2.err))
}

func TestRestartsRunOut(t *testing.T) {
	var r run
	l := newLauncher(t, "fail", &r, []string{"LAUNCH_TEST_FAIL=worker:0"}, launch.WithWorkers(1), launch.WithMaxRestarts(2))
	r.run(l)
	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, 2, te.Attempt, "tried three times")
	assert.Contains(t, r.err.Error(), "after 2 restarts")
	assert.Equal(t, 3, strings.Count(r.stdout.String(), "failing on purpose"))
}

func TestSignalStopsEveryTaskAndItsChildren(t *testing.T) {
	var r run
	l := newLauncher(t, "sleep", &r, nil, launch.WithWorkers(2), launch.WithMaxRestarts(3))
	done := make(chan struct{})
	go func() { r.run(l); close(done) }()
	pids := waitPIDs(t, r.dir, 2)
	l.Signal(syscall.SIGTERM)
	<-done
	var ie *launch.InterruptedError
	require.ErrorAs(t, r.err, &ie, "an interrupted run is not restarted")
	assert.Equal(t, 128+int(syscall.SIGTERM), launch.ExitCode(r.err))
	assert.Less(t, r.took, testTimeout/2, "the tasks are stopped, not waited for until the %v timeout", testTimeout)
	assertAllGone(t, pids)
}

func TestTaskIgnoringSIGTERMIsKilledAfterTheGracePeriod(t *testing.T) {
	var r run
	l := newLauncher(t, "ignore-term", &r, nil, launch.WithWorkers(1), launch.WithGracePeriod(500*time.Millisecond))
	done := make(chan struct{})
	go func() { r.run(l); close(done) }()
	pids := waitPIDs(t, r.dir, 1)
	sent := time.Now()
	l.Signal(syscall.SIGTERM)
	<-done
	assert.GreaterOrEqual(t, time.Since(sent), 500*time.Millisecond, "SIGTERM was ignored, so the grace period ran out")
	assert.Less(t, time.Since(sent), testTimeout/2, "the task is killed after the grace period, not at the %v timeout", testTimeout)
	assertAllGone(t, pids)
}

func TestTimeoutBoundsATaskThatNeverExits(t *testing.T) {
	var r run
	// The timeout leaves the tasks time to start and record their pids
	// however loaded the machine.
	l := newLauncher(t, "sleep", &r, nil, launch.WithWorkers(2), launch.WithTimeout(5*time.Second))
	done := make(chan struct{})
	go func() { r.run(l); close(done) }()
	pids := waitPIDs(t, r.dir, 2)
	<-done
	var to *launch.TimeoutError
	require.ErrorAs(t, r.err, &to)
	assert.Len(t, to.Running, 2)
	assert.Equal(t, 124, launch.ExitCode(r.err))
	assert.Contains(t, r.err.Error(), "worker:0, worker:1 still running")
	assertAllGone(t, pids)
}

func TestParameterServerClusterEndsWithTheChief(t *testing.T) {
	for _, code := range []int{0, 4} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var r run
			l := newLauncher(t, "ps", &r, []string{"LAUNCH_TEST_CHIEF_CODE=" + strconv.Itoa(code)},
				launch.WithChief(true), launch.WithWorkers(2), launch.WithPS(1))
			done := make(chan struct{})
			go func() { r.run(l); close(done) }()
			pids := waitPIDs(t, r.dir, 3)
			<-done
			assert.Equal(t, code, launch.ExitCode(r.err), "the launcher returns the chief's status: %v", r.err)
			if code != 0 {
				var te *launch.TaskError
				require.ErrorAs(t, r.err, &te)
				assert.Equal(t, cluster.Chief, te.Task.Type)
			}
			assert.Less(t, r.took, testTimeout/2, "the servers are ended, not waited for until the %v timeout", testTimeout)
			assert.Contains(t, r.stdout.String(), "[chief:0] coordinator done")
			assertAllGone(t, pids)
		})
	}
}

func TestParameterServerThatExitsFailsTheRun(t *testing.T) {
	var r run
	l := newLauncher(t, "ps-exits", &r, nil, launch.WithChief(true), launch.WithWorkers(1), launch.WithPS(1))
	done := make(chan struct{})
	go func() { r.run(l); close(done) }()
	pids := waitPIDs(t, r.dir, 1)
	<-done
	var te *launch.TaskError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, cluster.Task{Type: cluster.PS}, te.Task, "a lost worker is restarted; a lost ps ends the run")
	assert.Contains(t, r.err.Error(), "must serve until the chief ends")
	assert.Equal(t, 1, launch.ExitCode(r.err))
	assertAllGone(t, pids)
}

func TestBasePortAndPortInUse(t *testing.T) {
	var r run
	l := newLauncher(t, "print", &r, nil, launch.WithWorkers(2))
	r.run(l)
	require.NoError(t, r.err)
	// Find two free consecutive ports by asking for one and trying the next.
	first := lineRE.FindStringSubmatch(r.stdout.String())
	require.NotNil(t, first)
	_, port, _ := strings.Cut(first[7], ":")
	base, _ := strconv.Atoi(port)

	var r2 run
	l = newLauncher(t, "print", &r2, nil, launch.WithWorkers(2), launch.WithBasePort(base))
	r2.run(l)
	if r2.err == nil {
		assert.Contains(t, r2.stdout.String(), fmt.Sprintf("addr=127.0.0.1:%d", base))
		assert.Contains(t, r2.stdout.String(), fmt.Sprintf("addr=127.0.0.1:%d", base+1))
	} else {
		assert.Contains(t, r2.err.Error(), "not free", "the only acceptable failure is a port taken meanwhile")
	}

	// A port in use is named.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	inUse := ln.Addr().(*net.TCPAddr).Port
	var r3 run
	l = newLauncher(t, "print", &r3, nil, launch.WithWorkers(1), launch.WithBasePort(inUse))
	r3.run(l)
	require.Error(t, r3.err)
	assert.Contains(t, r3.err.Error(), fmt.Sprintf("port %d (for worker:0) is not free", inUse))
}

func TestProgramNotFound(t *testing.T) {
	l, err := launch.New([]string{"/nonexistent/tfdist-test-program"}, launch.WithWorkers(2),
		launch.WithOutput(&bytes.Buffer{}, &bytes.Buffer{}), launch.WithMaxRestarts(3))
	require.NoError(t, err)
	err = l.Run(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "start worker:0")
	assert.True(t, errors.Is(err, os.ErrNotExist), "%v", err)
	assert.Equal(t, 1, launch.ExitCode(err))
}

func TestNewRejectsNonsense(t *testing.T) {
	cmd := []string{"true"}
	cases := map[string]struct {
		cmd  []string
		opts []launch.Option
		want string
	}{
		"no program":       {nil, nil, "no program"},
		"negative workers": {cmd, []launch.Option{launch.WithWorkers(-1)}, "workers: -1"},
		"no tasks":         {cmd, []launch.Option{launch.WithWorkers(0)}, "no chief"},
		"ps without chief": {cmd, []launch.Option{launch.WithPS(1)}, "--chief"},
		"ps no workers":    {cmd, []launch.Option{launch.WithPS(1), launch.WithChief(true), launch.WithWorkers(0)}, "at least one worker"},
		"restarts":         {cmd, []launch.Option{launch.WithMaxRestarts(-1)}, "max restarts"},
		"timeout":          {cmd, []launch.Option{launch.WithTimeout(-time.Second)}, "timeout"},
		"grace":            {cmd, []launch.Option{launch.WithGracePeriod(0)}, "grace"},
		"base port":        {cmd, []launch.Option{launch.WithWorkers(3), launch.WithBasePort(65534)}, "base port: 65534"},
		"base port and metrics": {cmd, []launch.Option{launch.WithWorkers(2), launch.WithMetrics(true), launch.WithBasePort(65533)},
			"base port: 65533, expected 1..65532 for 2 tasks (4 ports)"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := launch.New(c.cmd, c.opts...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	l, err := launch.New(cmd, launch.WithChief(true), launch.WithWorkers(2), launch.WithPS(2), launch.WithEvaluator(true))
	require.NoError(t, err)
	var names []string
	for _, task := range l.Tasks() {
		names = append(names, task.String())
	}
	assert.Equal(t, []string{"chief:0", "worker:0", "worker:1", "ps:0", "ps:1", "evaluator:0"}, names)
}

// Every task gets glibc's arena limit and TensorFlow's log level unless its
// environment sets them.
func TestTasksGetDefaults(t *testing.T) {
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{nil, "arenas=" + launch.DefaultMallocArenaMax},
		{[]string{"MALLOC_ARENA_MAX=8"}, "arenas=8"},
		{nil, "log level=" + launch.DefaultLogLevel},
		{[]string{"TF_CPP_MIN_LOG_LEVEL=0"}, "log level=0"},
	} {
		var r run
		base := slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "MALLOC_ARENA_MAX=") || strings.HasPrefix(kv, "TF_CPP_MIN_LOG_LEVEL=")
		})
		l, err := launch.New([]string{os.Args[0], "-test.run=^$"}, launch.WithEnv(append(append(base,
			"LAUNCH_TEST_HELPER=print", "LAUNCH_TEST_DIR="+t.TempDir()), c.extra...)),
			launch.WithOutput(&r.stdout, &r.stderr), launch.WithWorkers(2), launch.WithTimeout(30*time.Second))
		require.NoError(t, err)
		r.run(l)
		require.NoError(t, r.err, r.stderr.String())
		for _, task := range []string{"worker:0", "worker:1"} {
			assert.Contains(t, r.stdout.String(), "["+task+"] "+c.want, "%v", c.extra)
		}
	}
}
