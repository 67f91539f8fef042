package main

import (
	"math/rand/v2"
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
)

var (
	modelLine   = regexp.MustCompile(`model ([0-9a-f]{16})`)
	startedLine = regexp.MustCompile(`started task\s+\{"task": "worker:(\d+)", "pid": (\d+)`)
)

// TestElasticExampleLosesNoBit runs examples/elastic under launch
// --elastic, four workers with -deterministic 4 and --sizes 1,2,4, kills
// a random worker twice at random times (launch replaces each), and checks
// that every worker that finishes ends with the model the example trains
// alone, bit for bit, though the job trained with 4, 2 and 1 workers.
func TestElasticExampleLosesNoBit(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "elastic")
	out, err := exec.Command("go", "build", "-o", bin, "../../examples/elastic").CombinedOutput()
	require.NoError(t, err, "%s", out)
	args := []string{"-steps", "1500", "-deterministic", "4"}
	out, err = exec.Command(bin, args...).Output()
	require.NoError(t, err)
	want := modelLine.FindStringSubmatch(string(out))
	require.NotNil(t, want, "%s", out)

	cmd, stdout, stderr := tfdist(t, nil, append([]string{"launch", "--elastic", "--min-workers", "1", "--max-workers", "4",
		"--sizes", "1,2,4", "--timeout", "5m", "--", bin}, args...)...)
	require.NoError(t, cmd.Start())
	for range 2 {
		require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "4 workers from step 0") }, time.Minute, 10*time.Millisecond)
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		started := startedLine.FindAllStringSubmatch(stderr.String(), -1)
		pid, _ := strconv.Atoi(started[rand.IntN(len(started))][2])
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	require.Equal(t, 0, exitCode(t, cmd, 5*time.Minute), "%s\n%s", stdout, stderr)
	models := modelLine.FindAllStringSubmatch(stdout.String(), -1)
	require.NotEmpty(t, models, "%s", stdout)
	for _, m := range models {
		assert.Equal(t, want[1], m[1], "a worker's model differs from the one worker's:\n%s", stdout)
	}
	assert.Contains(t, stderr.String(), "failed; replacing it")
	t.Logf("memberships: %q", regexp.MustCompile(`\d+ workers from step \d+`).FindAllString(stdout.String(), -1))
}
