package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/classifier"
)

// classifierBin is the internal/cmd/digits program, built once.
var classifierBin struct {
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "soak-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	classifierBin.path = filepath.Join(dir, "digits")
	if out, err := exec.Command("go", "build", "-o", classifierBin.path, "../../../../internal/cmd/digits").CombinedOutput(); err != nil {
		classifierBin.err = fmt.Errorf("go build internal/cmd/digits: %v\n%s", err, out)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Two workers of two logical CPUs train 3,000 steps with the default
// collective timeout, on either backend: both exit 0 and neither ever holds
// more than 300 OS threads (a timeout thread per TensorFlow collective op
// once held thousands and killed the job within seconds).
func TestMultiWorkerThreadsStayBounded(t *testing.T) {
	for _, name := range []string{"multiworker", "multiworker-tensorflow"} {
		t.Run(name, func(t *testing.T) { threadsStayBounded(t, name) })
	}
}

// tfDuplicateRequest is in the error of a step that TensorFlow's
// distributed runtime refused because its 32-bit-seeded request id repeated
// one of the worker's last 100,000: a defect of TensorFlow's master
// sessions that the multiworker strategy names, and that ends a run on
// TensorFlow's collectives, rarely, whatever tfdist does.
const tfDuplicateRequest = "request was received twice"

func threadsStayBounded(t *testing.T, name string) {
	require.NoError(t, classifierBin.err)
	setup, err := Lookup(name)
	require.NoError(t, err)
	var r *Report
	var table strings.Builder
	// The property here is the threads' bound: a run that TensorFlow's
	// defect ended says nothing of it, so it is run once more.
	for attempt := 1; attempt <= 2; attempt++ {
		r, err = Run(context.Background(), setup, Options{Classifier: classifierBin.path, Steps: 3000,
			Interval: 250 * time.Millisecond, Bounds: DefaultBounds, Timeout: 5 * time.Minute})
		require.NoError(t, err)
		table.Reset()
		r.WriteTable(&table)
		t.Log("\n" + table.String())
		if r.Err == nil || !strings.Contains(r.Err.Error(), tfDuplicateRequest) {
			break
		}
		t.Logf("attempt %d was ended by TensorFlow's repeated-request defect", attempt)
	}
	require.NoError(t, r.Err, table.String())
	require.NotNil(t, r.Result, "the chief printed its result:\n%s", table.String())
	assert.Equal(t, 3000, r.Result.Steps)
	require.Len(t, r.Processes, 2)
	for _, p := range r.Processes {
		require.GreaterOrEqual(t, len(p.Samples), minSamples, "%s was sampled", p.Task)
		assert.LessOrEqual(t, p.MaxThreads(), DefaultBounds.MaxThreads, "%s OS threads", p.Task)
		assert.GreaterOrEqual(t, p.Samples[len(p.Samples)-1].Goroutines, 1, "%s reported its goroutines", p.Task)
	}
}

// The verdict: flat figures pass; growth past any bound, too many threads or
// too few samples fail, naming the figure.
func TestJudge(t *testing.T) {
	flat := func() *Process {
		p := &Process{PID: 1}
		for i := range 20 {
			p.Samples = append(p.Samples, Sample{At: time.Duration(i) * time.Second, Threads: 100, RSS: 100 << 20, FDs: 20, Goroutines: 30})
		}
		return p
	}
	unset := func(p *Process) {
		for i := range p.Samples {
			p.Samples[i].Goroutines = -1
		}
	}
	cases := map[string]struct {
		mutate func(*Process)
		steps  *classifier.StepTimes
		want   string
	}{
		"flat":             {mutate: func(*Process) {}, want: ""},
		"memory within":    {mutate: func(p *Process) { p.Samples[19].RSS = 109 << 20 }, want: ""},
		"memory grows":     {mutate: func(p *Process) { p.Samples[19].RSS = 111 << 20 }, want: "resident memory grew"},
		"threads":          {mutate: func(p *Process) { p.Samples[7].Threads = 301 }, want: "301 OS threads"},
		"files":            {mutate: func(p *Process) { p.Samples[18].FDs, p.Samples[19].FDs = 23, 23 }, want: "file descriptors grew from 20 to 23"},
		"a passing file":   {mutate: func(p *Process) { p.Samples[19].FDs = 25 }, want: ""},
		"goroutines":       {mutate: func(p *Process) { p.Samples[18].Goroutines, p.Samples[19].Goroutines = 41, 41 }, want: "goroutines grew from 30 to 41"},
		"goroutines unset": {mutate: func(p *Process) { unset(p); p.Samples[19].Goroutines = 500 }, want: ""},
		"steps even":       {mutate: func(*Process) {}, steps: &classifier.StepTimes{Steps: 100, MedianMS: 2, MaxMS: 10}},
		"a stalled step":   {mutate: func(*Process) {}, steps: &classifier.StepTimes{Steps: 100, MedianMS: 2, MaxMS: 10.5}, want: "the slowest of 100 steps took 10.5 ms, 5.2 times the median"},
		"few samples":      {mutate: func(p *Process) { p.Samples = p.Samples[:3] }, want: "too few to judge"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p := flat()
			c.mutate(p)
			r := &Report{Processes: []*Process{p}, Result: &resultLine{}}
			r.Result.StepTimes = c.steps
			r.judge(DefaultBounds)
			if c.want == "" {
				assert.Empty(t, r.Violations)
				assert.False(t, r.Failed())
				return
			}
			require.Len(t, r.Violations, 1)
			assert.Contains(t, r.Violations[0], c.want)
			assert.True(t, r.Failed())
		})
	}
}

func TestParseStats(t *testing.T) {
	g, heap, ok := parseStats("stats goroutines=12 heap=4096")
	require.True(t, ok)
	assert.Equal(t, 12, g)
	assert.Equal(t, int64(4096), heap)
	g, heap, ok = parseStats("stats goroutines=7")
	require.True(t, ok)
	assert.Equal(t, 7, g)
	assert.Equal(t, int64(-1), heap, "no heap reported")
	_, _, ok = parseStats("step 100/200 loss 0.1")
	assert.False(t, ok)
}
