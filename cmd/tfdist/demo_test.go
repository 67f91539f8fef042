package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDemoTrains(t *testing.T) {
	code, out, errOut := runHere(nil, "", "demo", "-steps", "150", "-log-every", "50", "-json")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "mirrored strategy, 2 device(s)")
	assert.Contains(t, out, "step 150/150")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res struct {
		Strategy string  `json:"strategy"`
		Replicas int     `json:"replicas"`
		Accuracy float64 `json:"accuracy"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res))
	assert.Equal(t, "mirrored", res.Strategy)
	assert.Equal(t, 2, res.Replicas)
	assert.Greater(t, res.Accuracy, 0.85)

	code, _, errOut = runHere(nil, "", "demo", "-devices", "0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "-devices 0")
	_, help, _ := runHere(nil, "", "demo", "-h")
	assert.Contains(t, help, `(default "mirrored")`)
}

// The classifier's fault-injection hooks (environment variables of the
// tests) are not among the flags tfdist demo shows.
func TestDemoUsageHidesFaultInjection(t *testing.T) {
	code, help, _ := runHere(nil, "", "demo", "-h")
	require.Equal(t, 0, code)
	assert.Contains(t, help, "-checkpoint-dir")
	assert.NotContains(t, help, "crash")
	assert.NotContains(t, help, "TFDIST_TEST")
}

func TestBenchComparesStrategies(t *testing.T) {
	code, out, errOut := runHere(nil, "", "bench", "-steps", "20", "-global-batch", "32")
	require.Equal(t, 0, code, errOut)
	for _, row := range []string{"default", "mirrored, 1 device", "mirrored, 2 devices", "mirrored, 4 devices", "multiworker, 1 process, 2 devices"} {
		assert.Contains(t, out, row)
	}
	assert.Regexp(t, `(?m)^default\s+\d+\s+[\d.]+\s+1\.00$`, out)
	code, _, errOut = runHere(nil, "", "bench", "-global-batch", "30")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "-global-batch 30")
}
