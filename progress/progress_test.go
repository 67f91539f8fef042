package progress_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/progress"
)

// clock is a fake clock that Tick advances.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Tick(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// When the output is not a terminal, a plain line is printed every N steps
// with the step, the loss, the rate and the ETA, and Close prints the final
// line with the elapsed time — and nothing else is written.
func TestPlainLines(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 100, 32, progress.WithEvery(25), progress.WithClock(clk.Now))
	assert.False(t, r.Terminal(), "a bytes.Buffer is not a terminal")
	for step := 1; step <= 100; step++ {
		clk.Tick(10 * time.Millisecond) // 100 steps/s × 32 = 3200 examples/s
		r.Update(step, 1/float64(step))
	}
	require.NoError(t, r.Close())
	assert.Equal(t, strings.Join([]string{
		"step  25/100  loss 0.0400  3200 examples/s  ETA 750ms",
		"step  50/100  loss 0.0200  3200 examples/s  ETA 500ms",
		"step  75/100  loss 0.0133  3200 examples/s  ETA 250ms",
		"step 100/100  loss 0.0100  3200 examples/s  elapsed 1s",
		"",
	}, "\n"), out.String())
	assert.NotContains(t, out.String(), "\r")
}

// WithMetric shows a value of the step after the loss, on every line.
func TestMetric(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 4, 8, progress.WithEvery(2), progress.WithClock(clk.Now),
		progress.WithMetric("ε", func(step int) float64 { return 0.5 * float64(step) }))
	for step := 1; step <= 4; step++ {
		clk.Tick(time.Second)
		r.Update(step, 1)
	}
	require.NoError(t, r.Close())
	assert.Equal(t, "step 2/4  loss 1.0000  ε 1  8 examples/s  ETA 2s\nstep 4/4  loss 1.0000  ε 2  8 examples/s  elapsed 4s\n", out.String())
}

// On a terminal the status line is redrawn in place with a progress bar, at
// most once per refresh interval, and Close ends it with a newline.
func TestTerminalRedrawsOneLine(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 200, 64, progress.WithTerminal(true), progress.WithRefresh(100*time.Millisecond),
		progress.WithClock(clk.Now))
	require.True(t, r.Terminal())
	for step := 1; step <= 150; step++ {
		clk.Tick(10 * time.Millisecond)
		r.Update(step, 2/float64(step))
	}
	mid := out.String()
	assert.NotContains(t, mid, "\n", "nothing but redraws before Close")
	draws := strings.Count(mid, "\r")
	assert.InDelta(t, 15, draws, 1, "1.5 s of updates every 10 ms, redrawn every 100 ms")
	last := mid[strings.LastIndex(mid, "\r")+1:]
	assert.Equal(t, "step 141/200 [==============>     ]  70%  loss 0.0142  6400 examples/s  ETA 590ms", last,
		"drawn at steps 1, 11, …, 141")

	require.NoError(t, r.Close())
	final := out.String()[len(mid):]
	assert.Equal(t, "\rstep 150/200 [===============>    ]  75%  loss 0.0133  6400 examples/s  elapsed 1s\n", final)
}

// A shorter line blanks what is left of a longer one, so no stale
// characters remain on the terminal.
func TestTerminalBlanksLeftovers(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 0, 1, progress.WithTerminal(true), progress.WithRefresh(0), progress.WithClock(clk.Now))
	clk.Tick(time.Second)
	r.Update(1, 12345.678) // a long loss
	clk.Tick(time.Second)
	r.Update(2, 1)
	parts := strings.Split(out.String(), "\r")
	require.Len(t, parts, 3)
	assert.Equal(t, len(parts[1]), len(parts[2]), "the second line is padded to the first's length")
	assert.True(t, strings.HasSuffix(parts[2], " "), parts[2])
	require.NoError(t, r.Close())
}

// The rate, and so the ETA, follow the recent speed: a slow first step
// (graph compilation) stops mattering once the window has moved past it.
func TestETAFollowsRecentRate(t *testing.T) {
	clk := newClock()
	r := progress.New(&bytes.Buffer{}, 1000, 10, progress.WithClock(clk.Now))
	clk.Tick(5 * time.Second)
	r.Update(1, 1)
	st := r.Stats()
	assert.InDelta(t, 2, st.ExamplesPerSec, 1e-9, "1 step of 10 examples in 5 s")
	for step := 2; step <= 100; step++ {
		clk.Tick(10 * time.Millisecond)
		r.Update(step, 1)
	}
	st = r.Stats()
	assert.InDelta(t, 1000, st.ExamplesPerSec, 1e-6, "100 steps/s of 10 examples once the slow step is out of the window")
	assert.InDelta(t, (9 * time.Second).Seconds(), st.ETA.Seconds(), 1e-6, "900 steps left at 100 steps/s")
	assert.Equal(t, 100, st.Step)
	assert.Equal(t, 1000, st.Total)
	assert.InDelta(t, (5*time.Second + 990*time.Millisecond).Seconds(), st.Elapsed.Seconds(), 1e-9)
}

// A run that resumes from a checkpoint counts only the steps it runs.
func TestInitialStep(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 1000, 10, progress.WithInitialStep(900), progress.WithEvery(50), progress.WithClock(clk.Now))
	for step := 901; step <= 1000; step++ {
		clk.Tick(100 * time.Millisecond)
		r.Update(step, 0.5)
	}
	require.NoError(t, r.Close())
	assert.Contains(t, out.String(), "step  950/1000  loss 0.5000  100 examples/s  ETA 5s\n")
}

// Without a known total the lines show the step, loss and rate, no ETA.
func TestUnknownTotal(t *testing.T) {
	var out bytes.Buffer
	clk := newClock()
	r := progress.New(&out, 0, 8, progress.WithClock(clk.Now))
	for step := 1; step <= 250; step++ {
		clk.Tick(time.Millisecond)
		r.Update(step, 0.25)
	}
	require.NoError(t, r.Close())
	assert.Equal(t, "step 100  loss 0.2500  8000 examples/s\nstep 200  loss 0.2500  8000 examples/s\n"+
		"step 250  loss 0.2500  8000 examples/s  elapsed 250ms\n", out.String())
}

// WithLogger logs the progress as structured fields, tagged with the task,
// at the plain-line cadence, and "training done" on Close.
func TestLoggerFields(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l := logging.ForTask(zap.New(core), "worker", 1)
	clk := newClock()
	r := progress.New(&bytes.Buffer{}, 40, 16, progress.WithTerminal(true), progress.WithEvery(20),
		progress.WithLogger(l), progress.WithClock(clk.Now))
	for step := 1; step <= 40; step++ {
		clk.Tick(20 * time.Millisecond)
		r.Update(step, 0.5)
	}
	require.NoError(t, r.Close())
	entries := logs.AllUntimed()
	require.Len(t, entries, 2, "step 20, then done at 40: logging does not depend on the terminal mode")
	assert.Equal(t, "training progress", entries[0].Message)
	assert.Equal(t, "training done", entries[1].Message)
	assert.EqualValues(t, 40, entries[1].ContextMap()["step"])
	f := entries[0].ContextMap()
	assert.Equal(t, "worker", f["task_type"])
	assert.EqualValues(t, 1, f["task_index"])
	assert.EqualValues(t, 20, f["step"])
	assert.EqualValues(t, 40, f["total_steps"])
	assert.EqualValues(t, 0.5, f["loss"])
	assert.InDelta(t, 800, f["examples_per_sec"], 1e-6)
	assert.Equal(t, 400*time.Millisecond, f["eta"])
}

type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	w.n++
	return 0, errors.New("disk full")
}

// A writer that fails does not stop training: Update carries on, and Close
// reports the first error, once.
func TestWriteErrorsReportedByClose(t *testing.T) {
	w := &failingWriter{}
	r := progress.New(w, 10, 1, progress.WithEvery(1))
	for step := 1; step <= 10; step++ {
		r.Update(step, 1)
	}
	err := r.Close()
	require.Error(t, err)
	assert.ErrorContains(t, err, "disk full")
	assert.Equal(t, 1, w.n, "no writes after the first failure")
	assert.NoError(t, r.Close(), "closing again")
	r.Update(11, 1) // ignored after Close, no panic
}

// Updates from several goroutines are safe.
func TestConcurrentUpdates(t *testing.T) {
	var out bytes.Buffer
	r := progress.New(&out, 4000, 1, progress.WithEvery(500))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= 1000; i++ {
				r.Update(g*1000+i, 1)
				_ = r.Stats()
			}
		}()
	}
	wg.Wait()
	require.NoError(t, r.Close())
	assert.Contains(t, out.String(), "elapsed")
}

// Files and pipes are not terminals, so programs redirected to a log get
// plain lines.
func TestIsTerminal(t *testing.T) {
	assert.False(t, progress.IsTerminal(&bytes.Buffer{}))
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, progress.IsTerminal(f), "a regular file")
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pr.Close()
	defer pw.Close()
	assert.False(t, progress.IsTerminal(pw), "a pipe")
	assert.False(t, progress.New(pw, 10, 1).Terminal())
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0ms",
		850 * time.Millisecond:                "850ms",
		12*time.Second + 900*time.Millisecond: "12s",
		3*time.Minute + 5*time.Second:         "3m05s",
		time.Hour + 2*time.Minute + 3*time.Second + 400*time.Millisecond: "1h02m03s",
		49 * time.Hour: "49h00m00s",
	} {
		assert.Equal(t, want, progress.FormatDuration(d), "%v", d)
	}
}

// Update is on the training loop's hot path: the steps that print nothing
// cost a lock, a clock read and a few stores.
func BenchmarkUpdate(b *testing.B) {
	r := progress.New(io.Discard, 0, 64, progress.WithEvery(1<<30))
	b.ReportAllocs()
	for i := range b.N {
		r.Update(i+1, 0.5)
	}
}
