package allreducebench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// The tests re-execute this test binary as the benchmark's processes.
func TestMain(m *testing.M) {
	if code, ok := RunRole(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func self() Exec { return Exec{Path: os.Args[0]} }

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"4": 4, "4096": 4096, "4KiB": 4096, "1MiB": 1 << 20, "16 MiB": 16 << 20, "2GiB": 2 << 30, "12B": 12,
	} {
		got, err := ParseSize(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, got, in)
		}
	}
	for in, want := range map[string]string{
		"": "expected a positive whole number", "0": "positive", "-4": "positive", "1.5MiB": "whole number",
		"4kb": "KiB, MiB or GiB", "6": "multiple of 4", "2TiB": "positive whole number", "4096GiB": "positive whole number",
	} {
		_, err := ParseSize(in)
		if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), want, in)
		}
	}
	got, err := ParseSizes("1MiB, 16MiB,4096")
	require.NoError(t, err)
	assert.Equal(t, []int64{1 << 20, 16 << 20, 4096}, got)
}

func TestFormat(t *testing.T) {
	assert.Equal(t, "4 KiB", FormatSize(4096))
	assert.Equal(t, "64 MiB", FormatSize(64<<20))
	assert.Equal(t, "1 GiB", FormatSize(1<<30))
	assert.Equal(t, "4100 B", FormatSize(4100))
	assert.Equal(t, "1536 KiB", FormatSize(1536<<10))
	assert.Equal(t, "0.50 MiB/s", FormatBandwidth(1<<19))
	assert.Equal(t, "12.5 MiB/s", FormatBandwidth(12.5*(1<<20)))
	assert.Equal(t, "3223 MiB/s", FormatBandwidth(3223*(1<<20)))
	assert.Equal(t, "12.0 GiB/s", FormatBandwidth(12*(1<<30)))
}

func TestBackends(t *testing.T) {
	for s, want := range map[string]multiworker.Communication{"tfdist": multiworker.Engine, "tensorflow": multiworker.Ring} {
		b, err := ParseBackend(s)
		require.NoError(t, err)
		comm, err := b.Communication()
		require.NoError(t, err)
		assert.Equal(t, want, comm)
	}
	_, err := ParseBackend("ring")
	assert.ErrorContains(t, err, "expected tfdist or tensorflow")
}

func TestBusBW(t *testing.T) {
	tm := Timing{Bytes: 1 << 20, Seconds: 0.5}
	assert.InDelta(t, 2<<20, tm.AlgBW(), 1e-6)
	assert.InDelta(t, 2<<20, tm.BusBW(2), 1e-6)
	assert.InDelta(t, 2*(2<<20)*3/4, tm.BusBW(4), 1e-6)
}

// TestItersBySize checks that a size's default runs move about 1 GiB, never
// fewer than 10 nor more than 1,000.
func TestItersBySize(t *testing.T) {
	for size, want := range map[int64]int{4: 1000, 1 << 20: 1000, 16 << 20: 64, 64 << 20: 16, 100 << 20: 10, 1 << 30: 10} {
		assert.Equal(t, want, itersFor(size), "%d bytes", size)
	}
	assert.Equal(t, 3, Config{Iters: 3}.iters(1<<20), "a Config's Iters, when set")
}

// The inputs' sum is exact, and checkSum names the replica and the first
// element that differs.
func TestCheckSum(t *testing.T) {
	const n = 1000
	for _, c := range []struct{ workers, local int }{{2, 1}, {3, 1}, {2, 2}} {
		sum := make([]float32, n)
		for w := range c.workers {
			for i, x := range Input(w, n) {
				sum[i] += x * float32(c.local)
			}
		}
		for i := range sum {
			require.Equal(t, ExpectedSum(c.workers, c.local, i), sum[i], "%+v: element %d", c, i)
		}
		per := make(strategy.PerReplica, c.local)
		for r := range per {
			var err error
			per[r], err = tf.NewTensor(sum)
			require.NoError(t, err)
		}
		assert.NoError(t, checkSum(per, c.workers, c.local, 0), "%+v", c)
	}
	assert.NotEqual(t, Input(0, 300), Input(1, 300), "the workers' inputs differ")

	sum := make([]float32, n)
	for i := range sum {
		sum[i] = ExpectedSum(2, 1, i)
	}
	sum[700] = -sum[700] + 1
	sum[900]++
	bad, err := tf.NewTensor(sum)
	require.NoError(t, err)
	assert.EqualError(t, checkSum(strategy.PerReplica{bad}, 2, 1, 0),
		fmt.Sprintf("replica 0: element 700 of the all-reduced sum is %v, expected %v (2 of 1000 elements differ)", sum[700], ExpectedSum(2, 1, 700)))
	assert.ErrorContains(t, checkSum(strategy.PerReplica{bad}, 2, 2, 0), "the all-reduce returned 1 tensors for 2 local replicas")
}

// Both backends' workers time the sizes and check every sum (a wrong one
// fails the worker, so AllReduce's error).
func TestAllReduce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, b := range Backends {
		res, err := AllReduce(ctx, self(), 2, Config{Backend: b, Sizes: []int64{4096, 64 << 10}, Iters: 2})
		require.NoError(t, err, b)
		require.Len(t, res.Timings, 2, b)
		assert.Equal(t, int64(4096), res.Timings[0].Bytes, b)
		assert.Equal(t, int64(64<<10), res.Timings[1].Bytes, b)
		for _, tm := range res.Timings {
			assert.Positive(t, tm.Seconds, b)
			assert.Equal(t, 2, tm.Runs, b)
		}
		assert.True(t, strings.HasPrefix(res.Line, `[{"bytes":4096,"seconds":`), res.Line)
	}
}

func TestAllReduceNamesTheFailedWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Worker 1 fails at once; worker 0 would wait for a minute unless stopped.
	script := `case "$TF_CONFIG" in *'"index":1'*) echo "line one"; echo "bad luck" >&2; exit 3;; esac; exec sleep 60`
	start := time.Now()
	_, err := AllReduce(ctx, Exec{Path: "/bin/sh", Args: []string{"-c", script}}, 2, Config{Backend: TensorFlow, Sizes: []int64{4096}, Iters: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "worker 1 of 2 failed: exit status 3")
	assert.Contains(t, err.Error(), "its last output:\n\t")
	assert.Contains(t, err.Error(), "\tline one")
	assert.Contains(t, err.Error(), "\tbad luck")
	assert.Less(t, time.Since(start), 30*time.Second, "the other worker is stopped")
}

func TestAllReduceTimesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := AllReduce(ctx, Exec{Path: "/bin/sh", Args: []string{"-c", "echo waiting; exec sleep 60"}}, 2,
		Config{Backend: TensorFlow, Sizes: []int64{4096}, Iters: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "context deadline exceeded")
	assert.Contains(t, err.Error(), "worker 0 of 2 was still running; its last output:\n\twaiting")
	assert.Contains(t, err.Error(), "worker 1 of 2 was still running")
}

func TestAllReduceRejectsBadConfigs(t *testing.T) {
	ctx := context.Background()
	_, err := AllReduce(ctx, self(), 1, Config{Backend: TensorFlow, Sizes: []int64{4096}, Iters: 1})
	assert.ErrorContains(t, err, "1 workers: expected at least 2")
	_, err = AllReduce(ctx, self(), 2, Config{Backend: "nccl", Sizes: []int64{4096}, Iters: 1})
	assert.ErrorContains(t, err, `unknown backend "nccl"`)
	_, err = AllReduce(ctx, self(), 2, Config{Backend: Tfdist, Sizes: []int64{6}, Iters: 1})
	assert.ErrorContains(t, err, "size 6 bytes")
	_, err = AllReduce(ctx, self(), 2, Config{Backend: Tfdist, Sizes: []int64{4}, Iters: -1})
	assert.ErrorContains(t, err, "-1 iterations: expected 0 (by size) or more")
	_, err = AllReduce(ctx, Exec{Path: "/nonexistent/tfdist"}, 2, Config{Backend: Tfdist, Sizes: []int64{4}, Iters: 1})
	assert.ErrorContains(t, err, "starting worker 0 of 2")
}

func TestTCPBandwidth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bw, err := TCPBandwidth(ctx, self(), 16<<20)
	require.NoError(t, err)
	assert.Positive(t, bw)

	_, err = TCPBandwidth(ctx, Exec{Path: "/bin/sh", Args: []string{"-c", "echo cannot send >&2; exit 4"}}, 1<<20)
	assert.ErrorContains(t, err, "tcp sender failed: exit status 4; its last output:\n\tcannot send")
}
