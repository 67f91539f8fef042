package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/allreducebench"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/syncbuf"
)

// The workers are this test binary re-executed: TestMain plays their role.
func TestBenchAllReducePrintsWorker0sTimings(t *testing.T) {
	code, out, errOut := runHere(nil, "", "bench", "allreduce", "--workers", "2", "--backend", "tensorflow",
		"--sizes", "4KiB", "--iters", "2", "--json")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 1, "stdout is exactly worker 0's JSON line: %q", out)
	var ts []allreducebench.Timing
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &ts), lines[0])
	require.Len(t, ts, 1)
	assert.Equal(t, int64(4096), ts[0].Bytes)
	assert.Positive(t, ts[0].Seconds)
	assert.Equal(t, 2, ts[0].Runs)
}

func TestBenchAllReduceTable(t *testing.T) {
	code, out, errOut := runHere(nil, "", "bench", "allreduce", "--backend", "tensorflow", "--sizes", "4096,64KiB", "--iters", "2")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "between 2 worker processes")
	assert.Contains(t, out, "backend tensorflow")
	assert.Regexp(t, `(?m)^4 KiB\s+2\s+[\d.]+ (µs|ms|s)\s+[\d.]+ [MG]iB/s\s+[\d.]+ [MG]iB/s\s+[\d.]+$`, out)
	assert.Regexp(t, `(?m)^64 KiB\s`, out)
	assert.Regexp(t, `(?m)^plain TCP copy of 256 MiB between two processes: [\d.]+ [MG]iB/s$`, out)
}

// With --tls, the table shows the all-reduce over TLS beside the same
// sizes in plaintext, measured in the same run, and their ratio.
func TestBenchAllReduceTLS(t *testing.T) {
	code, out, errOut := runHere(nil, "", "bench", "allreduce", "--tls", "--sizes", "64KiB,1MiB", "--iters", "2")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "backend tfdist (tfdist's collective engine) over mutual TLS")
	assert.Regexp(t, `(?m)^size\s.*\splaintext busbw\s+tls/plaintext$`, out)
	assert.Regexp(t, `(?m)^1 MiB\s.*\s[\d.]+ [MG]iB/s\s+[\d.]+$`, out)

	code, _, errOut = runHere(nil, "", "bench", "allreduce", "--tls", "--backend", "tensorflow")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "only tfdist's engine can use TLS")
}

// With --worker, each process joins TF_CONFIG's cluster as one worker, as on
// separate machines: worker 0 prints the table, the others nothing.
func TestBenchAllReduceAsClusterWorkers(t *testing.T) {
	ports, err := freeport.Loopback(2)
	require.NoError(t, err)
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {
		fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}})
	require.NoError(t, err)
	var outs []*syncbuf.Buffer
	var cmds []*exec.Cmd
	for w := range 2 {
		tfc, err := cluster.Marshal(spec, cluster.Task{Type: cluster.Worker, Index: w})
		require.NoError(t, err)
		cmd, out, errOut := tfdist(t, []string{"TF_CONFIG=" + tfc}, "bench", "allreduce", "--worker", "--sizes", "4KiB", "--iters", "2")
		require.NoError(t, cmd.Start())
		cmds, outs = append(cmds, cmd), append(outs, out)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("worker %d:\n%s%s", w, out, errOut)
			}
		})
	}
	for w, cmd := range cmds {
		assert.Equal(t, exitOK, exitCode(t, cmd, 2*time.Minute), "worker %d", w)
	}
	assert.Contains(t, outs[0].String(), "between the 2 workers of TF_CONFIG's cluster")
	assert.Regexp(t, `(?m)^4 KiB\s+2\s+[\d.]+ (µs|ms|s)\s+[\d.]+ [MG]iB/s\s+[\d.]+ [MG]iB/s$`, outs[0].String())
	assert.Empty(t, outs[1].String(), "only worker 0 prints")
}

func TestBenchAllReduceWorkerNeedsACluster(t *testing.T) {
	code, out, errOut := runHere(nil, "", "bench", "allreduce", "--worker")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "--worker: TF_CONFIG's cluster has 0 workers; expected a TF_CONFIG naming 2 or more chief and worker tasks")
	assert.Empty(t, out)
}

func TestBenchAllReduceFlagErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "nccl"}, `--backend "nccl": expected tfdist or tensorflow`},
		{[]string{"--workers", "1"}, "--workers 1: expected 2 or more"},
		{[]string{"--sizes", "1MiB,3x"}, `--sizes "1MiB,3x": size "3x": expected a positive whole number of bytes`},
		{[]string{"--sizes", "6"}, `size "6": expected a multiple of 4 bytes`},
		{[]string{"--sizes", ""}, `--sizes "": size ""`},
		{[]string{"--iters", "-1"}, "--iters -1: expected 0 (by size) or more"},
		{[]string{"--workers", "two"}, `invalid value "two" for flag -workers`},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--worker", "--workers", "3"}, "--workers 3 with --worker: the cluster in TF_CONFIG says how many workers there are"},
	}
	for _, c := range cases {
		code, out, errOut := runHere(nil, "", append([]string{"bench", "allreduce"}, c.args...)...)
		assert.Equal(t, exitUsage, code, "%q", c.args)
		assert.Contains(t, errOut, c.want, "%q", c.args)
		assert.Empty(t, out, "%q", c.args)
	}
}

func TestBenchHelpMentionsAllReduce(t *testing.T) {
	_, help, _ := runHere(nil, "", "help", "bench")
	assert.Contains(t, help, "tfdist bench allreduce")
	_, help, _ = runHere(nil, "", "bench", "allreduce", "-h")
	for _, flag := range []string{"-workers", "-backend", "-sizes", "-iters", "-json"} {
		assert.Contains(t, help, flag)
	}
}

// With --link the workers run on emulated hosts and the table gives the
// bus bandwidth against the link's rate; with --compression it adds
// float32's time, measured in the same run, and the speed-up. No host's
// namespace is left behind.
func TestBenchAllReduceOverEmulatedLinks(t *testing.T) {
	if err := emunet.Available(); err != nil {
		require.Empty(t, os.Getenv("CI"), "CI runs as root: %v", err)
		t.Skip(err)
	}
	code, out, errOut := runHere(nil, "", "bench", "allreduce", "--link", "1gbit,0.2ms", "--compression", "fp16", "--sizes", "1MiB", "--iters", "3")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "between 2 worker processes on emulated hosts, each host's link 1000mbit,200µs,0s,0%")
	assert.Contains(t, out, "the floats sent as fp16")
	assert.Regexp(t, `(?m)^size\s.*\sbusbw/link\s+float32 time\s+speed-up$`, out)
	assert.Regexp(t, `(?m)^1 MiB\s+3\s.*\s[\d.]+\s+[\d.]+ (µs|ms|s)\s+[\d.]+$`, out)
	list, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(list), fmt.Sprintf("tfdist-net-%d-", os.Getpid()), "a host's namespace was left behind")

	for args, want := range map[string][]string{
		"--link: link \"fast\"":                              {"--link", "fast"},
		"--tls with --compression":                           {"--tls", "--compression", "fp16"},
		`compression "zip": expected none`:                   {"--compression", "zip"},
		"compression topk(0.1): expected fp16, bf16 or int8": {"--compression", "topk(0.1)"},
	} {
		code, _, errOut := runHere(nil, "", append([]string{"bench", "allreduce"}, want...)...)
		assert.Equal(t, exitUsage, code, args)
		assert.Contains(t, errOut, args)
	}
}
