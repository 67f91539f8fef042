package main

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/emunet"
)

var (
	modelLine   = regexp.MustCompile(`model ([0-9a-f]{16})`)
	startedLine = regexp.MustCompile(`started task\s+\{"task": "worker:(\d+)", "pid": (\d+)`)
)

// TestElasticExampleLosesNoBit runs examples/elastic under launch
// --elastic --tls, three workers of up to four with -deterministic 4 and
// --sizes 1,2,4, adds a fourth (SIGUSR1: its certificate is made as it
// starts), kills a random worker twice at random times (launch replaces
// each), and checks that every worker that finishes ends with the model
// the example trains alone, bit for bit, though the job trained with 4, 2
// and 1 workers. Every connection of the job, to the rendezvous and
// between workers, was mutual TLS: launch requires it of every worker
// (TFDIST_REQUIRE_TLS), and the certificates are gone afterwards.
//
// On emulated hosts (--link, as root), where the rendezvous has a host of
// its own and a replacement takes its predecessor's, the same holds.
func TestElasticExampleLosesNoBit(t *testing.T) {
	bin := buildElasticExample(t)
	args := []string{"-steps", "1500", "-deterministic", "4"}
	out, err := exec.Command(bin, args...).Output()
	require.NoError(t, err)
	want := modelLine.FindStringSubmatch(string(out))
	require.NotNil(t, want, "%s", out)
	t.Run("tls", func(t *testing.T) { elasticLosesNoBit(t, bin, want[1], args, "--tls") })
	t.Run("link", func(t *testing.T) {
		if err := emunet.Available(); err != nil {
			require.Empty(t, os.Getenv("CI"), "CI runs as root: %v", err)
			t.Skip(err)
		}
		elasticLosesNoBit(t, bin, want[1], args, "--link", "1gbit,0.5ms")
	})
}

// elasticLosesNoBit runs the job of TestElasticExampleLosesNoBit under
// launch with flags and checks its workers' models against want.
func elasticLosesNoBit(t *testing.T, bin, want string, args []string, flags ...string) {
	cmd, stdout, stderr := tfdist(t, nil, slices.Concat([]string{"launch", "--elastic", "--workers", "3", "--min-workers", "1",
		"--max-workers", "4", "--sizes", "1,2,4", "--timeout", "5m"}, flags, []string{"--", bin}, args)...)
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "2 workers from step 0") }, time.Minute, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGUSR1))
	for range 2 {
		require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "4 workers from step") }, time.Minute, 10*time.Millisecond)
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		started := startedLine.FindAllStringSubmatch(stderr.String(), -1)
		pid, _ := strconv.Atoi(started[rand.IntN(len(started))][2])
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	require.Equal(t, 0, exitCode(t, cmd, 5*time.Minute), "%s\n%s", stdout, stderr)
	models := modelLine.FindAllStringSubmatch(stdout.String(), -1)
	require.NotEmpty(t, models, "%s", stdout)
	for _, m := range models {
		assert.Equal(t, want, m[1], "a worker's model differs from the one worker's:\n%s", stdout)
	}
	assert.Contains(t, stderr.String(), "failed; replacing it")
	assert.Contains(t, stderr.String(), `"task": "worker:3"`, "the fourth worker started")
	if slices.Contains(flags, "--tls") {
		dir := regexp.MustCompile(`TLS certificates made for the run.*"dir": "([^"]+)"`).FindStringSubmatch(stderr.String())
		require.NotNil(t, dir, "%s", stderr)
		assert.NoDirExists(t, dir[1], "launch removes the run's certificates")
	}
	t.Logf("memberships: %q", regexp.MustCompile(`\d+ workers from step \d+`).FindAllString(stdout.String(), -1))
}

// buildElasticExample builds examples/elastic and returns its path.
func buildElasticExample(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "elastic")
	out, err := exec.Command("go", "build", "-o", bin, "../../examples/elastic").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestElasticReplayEndsWithTheRunsModel runs examples/elastic, plainly
// (no -deterministic), under launch --elastic --membership-log, kills a
// random worker, and replays the log with launch --replay: the replay,
// with no kill, forms the same memberships at the same steps and ends
// with the run's model, bit for bit.
//
// Under the linear scaling rule (-per-worker-batch), where the global
// batch and the learning rate change with the workers, the same holds.
func TestElasticReplayEndsWithTheRunsModel(t *testing.T) {
	bin := buildElasticExample(t)
	for _, flags := range [][]string{nil, {"-per-worker-batch", "16"}} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			replayRun(t, append([]string{"--", bin, "-steps", "3000"}, flags...))
		})
	}
}

// replayRun runs the job of args, kills a worker, replays the run's log,
// and checks the replay's model.
func replayRun(t *testing.T, args []string) {
	log := filepath.Join(t.TempDir(), "memberships.log")
	cmd, stdout, stderr := tfdist(t, nil, append([]string{"launch", "--elastic", "--min-workers", "1", "--max-workers", "3",
		"--timeout", "5m", "--membership-log", log}, args...)...)
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "3 workers from step 0") }, time.Minute, 10*time.Millisecond)
	time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond)
	started := startedLine.FindAllStringSubmatch(stderr.String(), -1)
	pid, _ := strconv.Atoi(started[rand.IntN(len(started))][2])
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Equal(t, 0, exitCode(t, cmd, 5*time.Minute), "%s\n%s", stdout, stderr)
	run := modelLine.FindAllStringSubmatch(stdout.String(), -1)
	require.NotEmpty(t, run, "%s", stdout)
	f, err := os.Open(log)
	require.NoError(t, err)
	entries, err := elastic.ReadLog(f)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(entries), 2, "the kill changed the membership: %+v", entries)

	cmd, stdout, stderr = tfdist(t, nil, append([]string{"launch", "--elastic", "--replay", log, "--timeout", "5m"}, args...)...)
	require.NoError(t, cmd.Start())
	require.Equal(t, 0, exitCode(t, cmd, 5*time.Minute), "%s\n%s", stdout, stderr)
	replayed := modelLine.FindAllStringSubmatch(stdout.String(), -1)
	require.NotEmpty(t, replayed, "%s", stdout)
	for _, m := range replayed {
		assert.Equal(t, run[0][1], m[1], "the replay's model differs from the run's:\n%s", stdout)
	}
	assert.NotContains(t, stderr.String(), "replacing it", "the replay had no failure")
	t.Logf("memberships: %q", regexp.MustCompile(`\d+ workers from step \d+`).FindAllString(stdout.String(), -1))
}

// A replay launch cannot run says why, naming the file or the worker, and
// a membership log is never written over.
func TestReplayAndLogErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
		return p
	}
	good := write("good.log", `{"epoch": 1, "step": 0, "members": ["worker:0"]}`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--replay", good, "--", "true"}, "a membership log and a replay are an elastic job's (--elastic)"},
		{[]string{"launch", "--elastic", "--replay", filepath.Join(dir, "none.log"), "--", "true"}, "none.log: no such file or directory"},
		{[]string{"launch", "--elastic", "--replay", write("chief.log", `{"epoch": 1, "members": ["chief:0"]}`), "--", "true"},
			`replay: membership 1 names "chief:0", expected worker:N as launch names its workers`},
		{[]string{"launch", "--elastic", "--replay", write("gap.log", `{"epoch": 1, "members": ["worker:0", "worker:2"]}`), "--", "true"},
			"the log names 2 workers but not worker:1"},
		{[]string{"launch", "--elastic", "--replay", write("bad.log", `{"epoch": 1, "members": ["worker:0"]}`, "{"), "--", "true"}, "membership log line 2"},
	} {
		code, _, stderr := runHere(nil, "", c.args...)
		assert.Equal(t, exitUsage, code, "%q", c.args)
		assert.Contains(t, stderr, c.want, "%q", c.args)
	}
	code, _, stderr := runHere(nil, "", "launch", "--elastic", "--membership-log", good, "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--membership-log: open "+good+": file exists (a membership log goes to a new file; the one there is kept)")
	code, _, stderr = runHere(nil, "", "launch", "--membership-log", filepath.Join(dir, "new.log"), "--", "true")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "a membership log is an elastic job's (--elastic)")
	assert.NoFileExists(t, filepath.Join(dir, "new.log"))
	b, err := os.ReadFile(good)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"worker:0"`, "the file is kept")
}

// Under launch --elastic --timeline --metrics, each worker serves its
// metrics at an address launch prints, kept by its replacement, and the
// merged trace holds every process's trace, the replacement's too, with a
// membership span for each membership a worker trained in.
func TestElasticTimelineAndMetrics(t *testing.T) {
	bin := buildElasticExample(t)
	trace := filepath.Join(t.TempDir(), "trace.json")
	cmd, stdout, stderr := tfdist(t, nil, "launch", "--elastic", "--workers", "2", "--timeline", trace, "--metrics", "--timeout", "5m", "--", bin, "-steps", "12000")
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "2 workers from step 0") }, time.Minute, 10*time.Millisecond)
	time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	started := startedLine.FindAllStringSubmatch(stderr.String(), -1)
	pid, _ := strconv.Atoi(started[1][2])
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return strings.Count(stdout.String(), "2 workers from step") == 2 }, time.Minute, 10*time.Millisecond,
		"the replacement joins: %s", stdout)
	require.Equal(t, 0, exitCode(t, cmd, 5*time.Minute), "%s\n%s", stdout, stderr)
	for _, w := range []string{"worker:0", "worker:1"} {
		assert.Regexp(t, `metrics\s+\{"task": "`+w+`", "url": "http://127.0.0.1:\d+/metrics"\}`, stderr.String())
	}
	assert.Equal(t, 2, strings.Count(stderr.String(), `"url": "http://`), "a replacement keeps its predecessor's address")

	b, err := os.ReadFile(trace)
	require.NoError(t, err)
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			PID  int            `json:"pid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &tr))
	memberships, names := map[int]int{}, map[int]string{}
	for _, e := range tr.TraceEvents {
		switch {
		case e.Name == "process_name":
			names[e.PID], _ = e.Args["name"].(string)
		case e.Cat == "membership":
			memberships[e.PID]++
		}
	}
	assert.Len(t, names, 2, "the survivor's trace and the replacement's (the killed worker wrote none): %v", names)
	most := 0
	for _, n := range memberships {
		most = max(most, n)
	}
	assert.GreaterOrEqual(t, most, 2, "the survivor trained in two memberships at least: %v", memberships)
}
