package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/syncbuf"
)

// Under tfdist launch --chief --workers 3 --ps 2, parameter-server training
// survives workers SIGKILLed at random moments — a random running worker
// each time, so any worker may die more than once — with nothing but the
// launcher's restarts: the launcher restarts each, every scheduled step is
// applied exactly once (the ps tasks' counter equals the steps), and the
// model reaches 95% held-out accuracy.
func TestParameterServerSurvivesKilledWorkers(t *testing.T) {
	needBinaries(t)
	const steps, kills = 6000, 3
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.tfdist, "launch", "--timeout", "5m", "--chief", "--workers", "3", "--ps", "2",
		"--task-restarts", "3", "--", bins.digits, "-strategy", "ps", "-steps", strconv.Itoa(steps),
		"-json", "-log-every", "100")
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	var err error
	exited := make(chan struct{})
	go func() { err = cmd.Wait(); close(exited) }()

	killed := killWorkers(t, out, exited, steps, kills, rng)
	<-exited
	text := out.String()
	require.NoError(t, err, text)
	require.Len(t, killed, kills, "the run ended before every kill:\n%s", text)
	elapsed := time.Since(start)

	r, ok := results(t, text)["chief:0"]
	require.True(t, ok, text)
	var restarted []string
	for _, m := range regexp.MustCompile(`restarting it at the same address\s+\{"task": "(worker:\d)"`).FindAllStringSubmatch(text, -1) {
		restarted = append(restarted, m[1])
	}
	assert.ElementsMatch(t, killed, restarted, "the launcher restarted each killed worker:\n%s", text)
	assert.EqualValues(t, steps, r.AppliedSteps, "every scheduled step applied exactly once:\n%s", text)
	assert.GreaterOrEqual(t, r.Accuracy, 0.95, text)
	// Whether the coordinator has taken a restarted worker back by the end
	// depends on the time left after its failure against the probes'
	// backoff (up to 5 s): a worker killed again while probed, as the same
	// one may be, can end the run unprobed. paramserver's
	// TestWorkerRestartedAtOnceLosesNoStep checks the taking back.
	coord := regexp.MustCompile(`(\d+) worker failure\(s\), (\d+) worker\(s\) taken back`).FindStringSubmatch(text)
	require.NotNil(t, coord, text)
	back, _ := strconv.Atoi(coord[2])
	t.Logf("%d steps, %d applied, accuracy %.2f%%, killed %v, %d restarts, the coordinator saw %s worker failures and took %d back, %v",
		steps, r.AppliedSteps, 100*r.Accuracy, killed, len(restarted), coord[1], back, elapsed.Round(time.Second))
}

var (
	startedTask = regexp.MustCompile(`started task\s+\{"task": "(worker:\d+)", "pid": (\d+), "attempt": (\d+)\}`)
	chiefStep   = regexp.MustCompile(`\[chief:0\] step +(\d+)/`)
)

// killWorkers SIGKILLs a random running worker kills times, each at a
// random moment once the chief has reported a step past a random point of
// the run, and returns the tasks it killed, in order. It returns early once
// exited is closed.
func killWorkers(t *testing.T, out *syncbuf.Buffer, exited <-chan struct{}, steps, kills int, rng *rand.Rand) []string {
	t.Helper()
	var at []int
	for range kills {
		at = append(at, steps/10+rng.IntN(steps*3/4))
	}
	slices.Sort(at)
	var killed []string
	for _, step := range at {
		for progress(out.String()) < step {
			select {
			case <-exited:
				t.Errorf("the launcher exited before step %d", step)
				return killed
			case <-time.After(50 * time.Millisecond):
			}
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		task, pid := randomRunningWorker(out.String(), rng)
		if pid == 0 {
			t.Errorf("no worker running at step %d:\n%s", step, out)
			return killed
		}
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		t.Logf("killed %s (pid %d) after step %d", task, pid, progress(out.String()))
		killed = append(killed, task)
	}
	return killed
}

// progress returns the last step the chief reported.
func progress(out string) int {
	m := chiefStep.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// randomRunningWorker picks a worker whose newest process, as the launcher
// logged its start, is running; pid 0 if none is.
func randomRunningWorker(out string, rng *rand.Rand) (string, int) {
	newest := map[string]int{}
	for _, m := range startedTask.FindAllStringSubmatch(out, -1) {
		newest[m[1]], _ = strconv.Atoi(m[2])
	}
	var running []string
	for task, pid := range newest {
		if processRunning(pid) {
			running = append(running, task)
		}
	}
	if len(running) == 0 {
		return "", 0
	}
	slices.Sort(running)
	task := running[rng.IntN(len(running))]
	return task, newest[task]
}

// processRunning reports whether pid is a process that has not exited.
func processRunning(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
