package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/allreducebench"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// The test binary doubles as the tfdist command (TFDIST_TEST_ROLE=tfdist),
// so that tests run it as a separate process without building it, and as a
// parameter-server coordinator (TFDIST_TEST_ROLE=coordinator), and, as
// tfdist itself does, plays a bench allreduce worker when started as one.
func TestMain(m *testing.M) {
	if code, ok := allreducebench.RunRole(); ok {
		os.Exit(code)
	}
	switch os.Getenv("TFDIST_TEST_ROLE") {
	case "tfdist":
		os.Exit(run(os.Args[1:], &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}))
	case "coordinator":
		os.Exit(coordinator())
	}
	os.Exit(m.Run())
}

// tfdist returns the command "tfdist args..." played by the test binary.
func tfdist(t *testing.T, extraEnv []string, args ...string) (*exec.Cmd, *syncbuf.Buffer, *syncbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TFDIST_TEST_ROLE=tfdist", "TF_CPP_MIN_LOG_LEVEL=1")
	cmd.Env = append(cmd.Env, extraEnv...)
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &stdout, &stderr
}

// exitCode runs cmd to its end, bounded, and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd, bound time.Duration) int {
	t.Helper()
	if cmd.Process == nil {
		require.NoError(t, cmd.Start())
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %v", cmd.Args, bound)
	}
	return cmd.ProcessState.ExitCode()
}

// runHere runs tfdist in this process.
func runHere(lookup map[string]string, stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb,
		lookupEnv: func(k string) (string, bool) { v, ok := lookup[k]; return v, ok }}
	code = run(args, e)
	return code, out.String(), errb.String()
}

func TestHelpListsEveryCommand(t *testing.T) {
	code, out, _ := runHere(nil, "", "help")
	assert.Equal(t, 0, code)
	for _, c := range commands {
		assert.Contains(t, out, c.name+" ")
		assert.Contains(t, out, c.summary)
	}
	assert.Contains(t, out, "TF_CONFIG")

	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			args := append(strings.Fields(c.name), "-h")
			code, viaFlag, _ := runHere(nil, "", args...)
			assert.Equal(t, 0, code)
			assert.Contains(t, viaFlag, "Usage: tfdist "+c.name)
			assert.Contains(t, viaFlag, "Examples")
			code, viaHelp, _ := runHere(nil, "", append([]string{"help"}, strings.Fields(c.name)...)...)
			assert.Equal(t, 0, code)
			assert.Equal(t, viaFlag, viaHelp, "'tfdist help X' and 'tfdist X -h' say the same")
		})
	}
	_, launchHelp, _ := runHere(nil, "", "launch", "-h")
	for _, flag := range []string{"-workers", "-chief", "-ps", "-evaluator", "-max-restarts", "-timeout", "-base-port", "-grace"} {
		assert.Contains(t, launchHelp, flag)
	}
	_, serverHelp, _ := runHere(nil, "", "server", "-h")
	assert.Contains(t, serverHelp, "-threads")
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"lanch"}, `unknown command "lanch"`},
		{[]string{"config"}, "config validate"},
		{[]string{"config", "check"}, "config validate"},
		{[]string{"launch", "--workers", "two"}, `invalid value "two"`},
		{[]string{"launch", "--workers", "2"}, "no program to run"},
		{[]string{"launch", "--ps", "1", "--", "true"}, "--chief"},
		{[]string{"server", "--threads", "-1"}, "threads"},
		{[]string{"help", "nope"}, "unknown command"},
		{[]string{"soak", "-strategies", "default,nope"}, `strategy "nope": expected one of [default mirrored multiworker multiworker-tensorflow ps robust topk wide pushed elastic]`},
		{[]string{"soak", "-max-rss-growth", "-0.5"}, "-max-rss-growth -0.5: expected 0 or more"},
		{[]string{"soak", "-digits", "/nonexistent/digits"}, "-digits /nonexistent/digits"},
	}
	for _, c := range cases {
		code, _, stderr := runHere(nil, "", c.args...)
		assert.Equal(t, exitUsage, code, "%q", c.args)
		assert.Contains(t, stderr, c.want, "%q", c.args)
	}
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	good := `{"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}, "task": {"type": "worker", "index": 1}}`

	t.Run("good file", func(t *testing.T) {
		code, out, _ := runHere(nil, "", "config", "validate", "--file", write("good.json", good))
		assert.Equal(t, 0, code)
		assert.Contains(t, out, "is valid")
		assert.Regexp(t, `worker:1\s+127.0.0.1:2224  <- this task`, out)
		assert.Regexp(t, `this task:\s+worker:1 at 127.0.0.1:2224`, out)
		assert.Regexp(t, `chief:\s+no \(the chief is chief:0\)`, out)
	})
	t.Run("from the environment", func(t *testing.T) {
		env := map[string]string{"TF_CONFIG": `{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}`}
		code, out, _ := runHere(env, "", "config", "validate")
		assert.Equal(t, 0, code)
		assert.Regexp(t, `chief:\s+yes \(worker 0 is the chief when the cluster has no chief\)`, out)
	})
	t.Run("stdin", func(t *testing.T) {
		code, out, _ := runHere(nil, `{}`, "config", "validate", "--file", "-")
		assert.Equal(t, 0, code)
		assert.Contains(t, out, "runs locally")
		assert.Regexp(t, `chief:\s+yes`, out)
	})
	t.Run("misspelt cluster", func(t *testing.T) {
		code, out, _ := runHere(nil, `{"clsuter": {"worker": ["a:1"]}}`, "config", "validate", "--file", "-")
		assert.Equal(t, 0, code, "TensorFlow accepts it, so tfdist does, but says so")
		assert.Contains(t, out, `"clsuter" is not a TF_CONFIG field`)
		assert.Contains(t, out, "misspelt")
	})
	t.Run("bad", func(t *testing.T) {
		code, out, stderr := runHere(nil, "", "config", "validate", "--file",
			write("bad.json", `{"cluster": {"worker": ["127.0.0.1:1", "localhost"]}, "task": {"type": "worker", "index": 2}}`))
		assert.Equal(t, exitFail, code)
		assert.Empty(t, out)
		assert.Contains(t, stderr, "bad.json) is not valid: 2 problems")
		assert.Contains(t, stderr, `- cluster.worker[1]: got "localhost", expected host:port`)
		assert.Contains(t, stderr, "- task.index: got 2, expected 0..1")
	})
	t.Run("malformed JSON", func(t *testing.T) {
		code, _, stderr := runHere(map[string]string{"TF_CONFIG": `{"cluster": `}, "", "config", "validate")
		assert.Equal(t, exitFail, code)
		assert.Contains(t, stderr, "valid JSON")
	})
	t.Run("missing", func(t *testing.T) {
		code, _, stderr := runHere(nil, "", "config", "validate")
		assert.Equal(t, exitFail, code)
		assert.Contains(t, stderr, "TF_CONFIG is not set")
		assert.Contains(t, stderr, "--file")
	})
	t.Run("no such file", func(t *testing.T) {
		code, _, stderr := runHere(nil, "", "config", "validate", "--file", filepath.Join(dir, "nope.json"))
		assert.Equal(t, exitFail, code)
		assert.Contains(t, stderr, "nope.json")
	})
}

// Each task launched sees the same cluster and its own task, and every line
// it writes carries its task.
func TestLaunchGivesEveryTaskItsTFConfig(t *testing.T) {
	cmd, stdout, stderr := tfdist(t, nil, "launch", "--chief", "--workers", "2", "--timeout", "60s", "--",
		os.Args[0], "config", "validate")
	require.Equal(t, 0, exitCode(t, cmd, 90*time.Second), "stderr: %s", stderr)
	out := stdout.String()
	fingerprints := regexp.MustCompile(`(?m)^\[(\w+:\d)\] cluster:\s+3 tasks, fingerprint (\w+)$`).FindAllStringSubmatch(out, -1)
	require.Len(t, fingerprints, 3, out)
	for _, m := range fingerprints {
		assert.Equal(t, fingerprints[0][2], m[2], "every task has the same cluster")
	}
	for _, task := range []string{"chief:0", "worker:0", "worker:1"} {
		assert.Regexp(t, regexp.MustCompile(`(?m)^\[`+task+`\] this task:\s+`+task+` at 127\.0\.0\.1:\d+`), out)
	}
	assert.Regexp(t, `(?m)^\[chief:0\] chief:\s+yes$`, out)
	assert.Regexp(t, `(?m)^\[worker:1\] chief:\s+no`, out)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		assert.Regexp(t, `^\[(chief|worker):\d\] `, line)
	}
	assert.Contains(t, stderr.String(), "[tfdist launch]", "launch says what it does")
}

// launchTimeout is the --timeout of the launches whose tasks sleep longer
// than it (600 s): what a launch that waited for them would take. One that
// must stop them rather than wait is checked to take less than half of
// it, so that only waiting fails the check, not a loaded machine.
const launchTimeout = 4 * time.Minute

func TestLaunchFailingTaskFailsTheRun(t *testing.T) {
	cmd, _, stderr := tfdist(t, nil, "launch", "--workers", "3", "--timeout", launchTimeout.String(), "--grace", "2s", "--",
		"sh", "-c", `if [ "$TFDIST_TASK_INDEX" = 1 ]; then exit 7; fi; exec sleep 600`)
	start := time.Now()
	assert.Equal(t, 7, exitCode(t, cmd, launchTimeout+time.Minute), "launch exits with the failed task's status")
	assert.Less(t, time.Since(start), launchTimeout/2, "the sleeping tasks are stopped, not waited for until the %v timeout", launchTimeout)
	assert.Contains(t, stderr.String(), "worker:1 exited with status 7")
}

func TestLaunchRestartsAfterAFailure(t *testing.T) {
	cmd, stdout, stderr := tfdist(t, nil, "launch", "--quiet", "--workers", "2", "--max-restarts", "1", "--timeout", "60s", "--",
		"sh", "-c", `if [ "$TFDIST_RESTART" = 0 ] && [ "$TFDIST_TASK_INDEX" = 1 ]; then exit 9; fi; echo "run $TFDIST_RESTART"`)
	require.Equal(t, 0, exitCode(t, cmd, 60*time.Second), "stderr: %s", stderr)
	assert.Contains(t, stdout.String(), "[worker:0] run 1")
	assert.Contains(t, stdout.String(), "[worker:1] run 1")
	assert.Contains(t, stderr.String(), "restarting", "--quiet keeps warnings")
	assert.NotContains(t, stderr.String(), "started task", "--quiet drops the routine messages")
}

// SIGTERM to launch reaches every task and every process a task started.
func TestLaunchSIGTERMLeavesNoProcessBehind(t *testing.T) {
	dir := t.TempDir()
	cmd, _, stderr := tfdist(t, nil, "launch", "--workers", "2", "--timeout", launchTimeout.String(), "--",
		"sh", "-c", `sleep 600 & echo $$ $! > "`+dir+`/$TFDIST_TASK_INDEX.tmp"; mv "`+dir+`/$TFDIST_TASK_INDEX.tmp" "`+dir+`/$TFDIST_TASK_INDEX.pids"; wait`)
	require.NoError(t, cmd.Start())
	var pids []int
	require.Eventually(t, func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pids"))
		return len(files) == 2
	}, time.Minute, 20*time.Millisecond, "the tasks did not start: %s", stderr)
	files, _ := filepath.Glob(filepath.Join(dir, "*.pids"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, s := range strings.Fields(string(b)) {
			p, err := strconv.Atoi(s)
			require.NoError(t, err)
			pids = append(pids, p)
		}
	}
	require.Len(t, pids, 4)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	// Waiting for the sleeping tasks, launch would end at its timeout.
	assert.Equal(t, 128+int(syscall.SIGTERM), exitCode(t, cmd, launchTimeout/2))
	assert.Contains(t, stderr.String(), "interrupted by terminated")
	assert.Eventually(t, func() bool {
		for _, p := range pids {
			if processAlive(p) {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "processes left behind among %v", pids)
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// The whole parameter-server flow: ps and worker tasks serve with "tfdist
// server", the chief coordinates (here: a variable on the ps task, one step
// on the worker, then exit 3); launch ends the servers when the chief
// exits and passes on its status.
func TestLaunchParameterServerCluster(t *testing.T) {
	script := `if [ "$TFDIST_TASK_TYPE" = chief ]; then TFDIST_TEST_ROLE=coordinator exec "$0"; else exec "$0" server; fi`
	cmd, stdout, stderr := tfdist(t, nil, "launch", "--chief", "--workers", "1", "--ps", "1", "--timeout", launchTimeout.String(), "--grace", "3s", "--",
		"sh", "-c", script, os.Args[0])
	start := time.Now()
	code := exitCode(t, cmd, launchTimeout+time.Minute)
	assert.Equal(t, 3, code, "launch returns the chief's status\nstdout: %s\nstderr: %s", stdout, stderr)
	assert.Contains(t, stdout.String(), "[chief:0] ps holds 42, worker computed 43")
	assert.Regexp(t, `\[ps:0\] .*serving`, stderr.String())
	assert.Regexp(t, `\[worker:0\] .*serving`, stderr.String())
	// The servers serve until they are stopped: waiting for them, launch
	// would end at its timeout. What this measures includes starting the
	// three processes and the chief's session.
	assert.Less(t, time.Since(start), launchTimeout/2, "the servers were ended, not waited for until the %v timeout", launchTimeout)
}

// coordinator is the chief of TestLaunchParameterServerCluster: it creates
// a variable on the ps task, reads it, runs one step on the worker that
// reads it too, prints both and exits 3.
func coordinator() int {
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout/2)
	defer cancel()
	ps, worker, err := chiefRun(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("ps holds %v, worker computed %v\n", ps, worker)
	return 3
}

// chiefRun is a parameter-server chief (of TF_CONFIG's cluster when r is
// nil): a variable of 42 on the ps task, its value read by the chief, and
// one step on a worker that adds 1 to it.
func chiefRun(ctx context.Context, r cluster.Resolver) (ps, worker any, err error) {
	s, err := paramserver.New(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	init, err := tf.NewTensor(int32(42))
	if err != nil {
		return nil, nil, err
	}
	var v strategy.Variable
	err = s.Scope(func(sc strategy.Scope) (err error) {
		v, err = sc.Variable("v", tf.Int32, nil, strategy.Constant(init))
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	val, err := s.Value(ctx, v)
	if err != nil {
		return nil, nil, err
	}
	step, err := s.Build(strategy.InputSpec{"x": {DType: tf.Int32, Shape: []int64{-1}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sc := r.Scope()
			x, err := r.Read(v)
			if err != nil {
				return nil, err
			}
			one := op.Const(sc.SubScope("one"), int32(1))
			return strategy.Outputs{"y": op.Add(sc.SubScope("add"), x, one)}, nil
		})
	if err != nil {
		return nil, nil, err
	}
	c, err := paramserver.NewCoordinator(s)
	if err != nil {
		return nil, nil, err
	}
	defer c.Done(ctx)
	x, _ := tf.NewTensor([]int32{0})
	rv, err := c.Schedule(step, paramserver.Feed(dataset.Element{"x": x}))
	if err != nil {
		return nil, nil, err
	}
	out, err := rv.Get(ctx)
	if err != nil {
		return nil, nil, err
	}
	return val.Value(), out["y"].Value(), nil
}

// Two "tfdist server" processes serve a ps and a worker task of a cluster
// whose chief is the test: a variable lives on the ps task, a step runs on
// the worker, and SIGTERM ends both servers cleanly.
func TestServerServes(t *testing.T) {
	ports := freePorts(t, 3)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {addr(0)}, cluster.Worker: {addr(1)}, cluster.PS: {addr(2)}})
	require.NoError(t, err)
	type server struct {
		cmd    *exec.Cmd
		stderr *syncbuf.Buffer
	}
	var servers []server
	for _, task := range []cluster.Task{{Type: cluster.Worker}, {Type: cluster.PS}} {
		tfConfig, err := cluster.Marshal(spec, task)
		require.NoError(t, err)
		cmd, _, stderr := tfdist(t, []string{"TF_CONFIG=" + tfConfig}, "server", "--threads", "2")
		require.NoError(t, cmd.Start())
		servers = append(servers, server{cmd, stderr})
	}
	for _, s := range servers {
		require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "serving") },
			60*time.Second, 50*time.Millisecond, "server did not come up: %s", s.stderr)
	}
	assert.Contains(t, servers[1].stderr.String(), `"task_type": "ps", "task_index": 0`, "log lines carry the task")

	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Chief})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ps, worker, err := chiefRun(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, int32(42), ps)
	assert.Equal(t, int32(43), worker)

	for _, srv := range servers {
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, srv := range servers {
		assert.Equal(t, 0, exitCode(t, srv.cmd, 20*time.Second), "SIGTERM ends a server cleanly: %s", srv.stderr)
		assert.Contains(t, srv.stderr.String(), "stopping")
	}
}

func TestServerRefusesBadConfigs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	inUse := ln.Addr().String()
	_, port, _ := net.SplitHostPort(inUse)
	cases := []struct {
		name     string
		tfConfig *string
		want     string
	}{
		{"missing", nil, "TF_CONFIG is not set"},
		{"local", ptr(`{}`), "names no cluster"},
		{"malformed", ptr(`{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 4}}`), "task.index: got 4"},
		{"no ps", ptr(`{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}`), "no chief job, no ps job"},
		{"the chief", ptr(`{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}}`),
			"Serve runs ps and worker tasks"},
		{"port in use", ptr(`{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["` + inUse + `"], "ps": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}`),
			"port " + port},
		{"TLS required", ptr(`{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}`),
			"TLS is required but not available: TFDIST_REQUIRE_TLS is set but no certificate is configured"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{}
			if c.name == "TLS required" {
				env[mtls.EnvRequire] = "1"
			}
			if c.tfConfig != nil {
				env["TF_CONFIG"] = *c.tfConfig
			}
			code, _, stderr := runHere(env, "", "server")
			assert.Equal(t, exitFail, code)
			assert.Contains(t, stderr, c.want)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}
