package main

import (
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
