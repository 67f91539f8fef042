// Package kerasbench measures an example's training step in Go against
// the same model trained by Keras 3's model.fit in Python TensorFlow 2.18,
// for the examples' BenchmarkAgainstKeras: both sides' steady-state steps
// per second, measured in alternating turns in one run, so that a change
// in the machine's load shows in both sides' figures rather than in their
// ratio.
//
// The Python side is a script in the cached TensorFlow environment
// (pyenv.TensorFlow) that stays up for the whole run and speaks JSON
// lines: it reads a setup line, builds and compiles its model, starts
// model.fit and, after its first step (the trace), prints {"ready": true,
// ...}; then for each line {"seconds": s, "warmup": w} it trains on until
// s seconds have passed after w more steps and prints {"steps": k,
// "seconds": t}, the steps after the warm-up and their time, and pauses
// until the next line. Each side is idle while the other measures.
package kerasbench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/syncbuf"
)

// Measure runs training steps: warmup of them untimed, then steps until
// seconds have passed, and returns the timed steps and their time.
type Measure func(seconds float64, warmup int) (steps int, elapsed time.Duration, err error)

// The flags of every benchmark that runs a comparison.
var (
	pairs   = flag.Int("pairs", 3, "BenchmarkAgainstKeras: measurements of each side")
	seconds = flag.Float64("seconds", 10, "BenchmarkAgainstKeras: seconds of each measurement")
	turns   = flag.Int("turns", 5, "BenchmarkAgainstKeras: turns each measurement is split into, alternating between the sides")
)

// Config is one comparison.
type Config struct {
	Script  string  // the Python side, speaking the protocol above
	Setup   any     // its setup line
	Pairs   int     // measurements of each side, each with its ratio (0: -pairs)
	Seconds float64 // each measurement's timed length, on each side (0: -seconds)
	// Turns splits each pair's measurements into turns of Seconds/Turns
	// that alternate between the two sides (at least 1): the shorter the
	// turns, the less a change of the machine's load between them moves
	// the pair's ratio. 0 takes -turns.
	Turns  int
	Warmup int // untimed steps before each turn (at least 1)
	// PerStep is the examples (or tokens) of one global batch, and Unit
	// their name per second ("examples/s", "tokens/s").
	PerStep float64
	Unit    string
}

// Pair is one Go measurement and the Keras measurement beside it, in
// steps per second.
type Pair struct{ Go, Keras float64 }

// Ratio is Go's steps/s over Keras's.
func (p Pair) Ratio() float64 { return p.Go / p.Keras }

// Run starts the Python side, which builds and traces its model, and runs
// goSide's step untimed to the same point (its first run optimises the
// graph); then it measures both sides c.Pairs times, each measurement in
// c.Turns turns alternating between the sides (Go first in every other
// turn), a side's steps/s its steps over its timed seconds in the pair.
// It reports the medians of each side's steps/s and c.Unit, each pair's
// ratio and their minimum, median and maximum as b's metrics, and returns
// the pairs.
func Run(b *testing.B, c Config, goSide Measure) []Pair {
	b.Helper()
	c.Pairs, c.Seconds, c.Turns = cmp.Or(c.Pairs, *pairs), cmp.Or(c.Seconds, *seconds), cmp.Or(c.Turns, *turns)
	c.Pairs, c.Warmup, c.Turns = max(c.Pairs, 1), max(c.Warmup, 1), max(c.Turns, 1)
	py := start(b, c.Script, c.Setup)
	defer py.close(b)
	_, _, err := goSide(0, c.Warmup)
	require.NoError(b, err, "go side, untimed")
	turn := c.Seconds / float64(c.Turns)
	pairs := make([]Pair, c.Pairs)
	for i := range pairs {
		var goSteps, kerasSteps int
		var goTime, kerasTime float64
		for j := range c.Turns {
			goFirst := (i*c.Turns+j)%2 == 0
			for k := range 2 {
				if (k == 0) == goFirst {
					steps, elapsed, err := goSide(turn, c.Warmup)
					require.NoError(b, err, "go side, pair %d", i+1)
					goSteps, goTime = goSteps+steps, goTime+elapsed.Seconds()
				} else {
					steps, elapsed := py.measure(b, turn, c.Warmup)
					kerasSteps, kerasTime = kerasSteps+steps, kerasTime+elapsed
				}
			}
		}
		pairs[i] = Pair{Go: float64(goSteps) / goTime, Keras: float64(kerasSteps) / kerasTime}
		b.Logf("pair %d: go %.2f steps/s, keras %.2f steps/s, ratio %.3f", i+1, pairs[i].Go, pairs[i].Keras, pairs[i].Ratio())
	}
	median := func(f func(Pair) float64) float64 {
		v := make([]float64, len(pairs))
		for i, p := range pairs {
			v[i] = f(p)
		}
		slices.Sort(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	goRate, kerasRate := median(func(p Pair) float64 { return p.Go }), median(func(p Pair) float64 { return p.Keras })
	ratios := make([]float64, len(pairs))
	for i, p := range pairs {
		ratios[i] = p.Ratio()
		b.ReportMetric(ratios[i], fmt.Sprintf("ratio-%d", i+1))
	}
	b.ReportMetric(goRate, "go-steps/s")
	b.ReportMetric(kerasRate, "keras-steps/s")
	b.ReportMetric(goRate*c.PerStep, "go-"+c.Unit)
	b.ReportMetric(kerasRate*c.PerStep, "keras-"+c.Unit)
	b.ReportMetric(slices.Min(ratios), "ratio-min")
	b.ReportMetric(median(Pair.Ratio), "ratio-median")
	b.ReportMetric(slices.Max(ratios), "ratio-max")
	return pairs
}

// python is the running Python side.
type python struct {
	cancel context.CancelFunc
	done   chan error
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *syncbuf.Buffer
}

// timeout bounds the whole Python process: importing TensorFlow and
// tracing the model take tens of seconds on two busy cores.
const timeout = 30 * time.Minute

func start(b *testing.B, script string, setup any) *python {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	cmd := pyenv.TensorFlow(b)(ctx, script)
	cmd.Env = withPythonPath(cmd.Env, serveDir())
	p := &python{cancel: cancel, done: make(chan error, 1), stderr: new(syncbuf.Buffer)}
	var err error
	p.in, err = cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = p.stderr
	require.NoError(b, cmd.Start(), "start %s", script)
	go func() { p.done <- cmd.Wait() }()
	p.out = bufio.NewScanner(stdout)
	var ready map[string]any
	t0 := time.Now()
	p.call(b, setup, &ready)
	b.Logf("%s: ready after %.1f s: %v", script, time.Since(t0).Seconds(), ready)
	return p
}

// serveDir returns the directory of serve.py, beside this file.
func serveDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// withPythonPath returns env (the process's own when nil) with dir first
// on PYTHONPATH.
func withPythonPath(env []string, dir string) []string {
	if env == nil {
		env = os.Environ()
	}
	for i, kv := range env {
		if rest, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			env[i] = "PYTHONPATH=" + dir + string(os.PathListSeparator) + rest
			return env
		}
	}
	return append(env, "PYTHONPATH="+dir)
}

// call writes in as one line and reads one line into out.
func (p *python) call(b *testing.B, in, out any) {
	b.Helper()
	line, err := json.Marshal(in)
	require.NoError(b, err)
	_, err = p.in.Write(append(line, '\n'))
	require.NoError(b, err, "python: %s", p.stderr)
	require.True(b, p.out.Scan(), "python ended: %v\n%s", p.out.Err(), p.stderr)
	require.NoError(b, json.Unmarshal(p.out.Bytes(), out), "python printed %q\n%s", p.out.Text(), p.stderr)
}

// measure runs one Keras measurement and returns its timed steps and
// seconds.
func (p *python) measure(b *testing.B, seconds float64, warmup int) (int, float64) {
	b.Helper()
	var got struct {
		Steps   int     `json:"steps"`
		Seconds float64 `json:"seconds"`
	}
	p.call(b, map[string]any{"seconds": seconds, "warmup": warmup}, &got)
	require.Positive(b, got.Steps, "keras measured no steps")
	return got.Steps, got.Seconds
}

// close ends the Python side's input and waits for it to exit.
func (p *python) close(b *testing.B) {
	b.Helper()
	defer p.cancel()
	require.NoError(b, p.in.Close())
	select {
	case err := <-p.done:
		require.NoError(b, err, "python: %s", p.stderr)
	case <-time.After(time.Minute):
		b.Errorf("python did not exit a minute after its input ended")
	}
}

// WriteRaw writes rows one after another to path, each element in the
// machine's byte order, as numpy's fromfile reads them: the examples the
// Keras side trains on.
func WriteRaw[T int32 | float32](tb testing.TB, path string, rows ...[]T) {
	tb.Helper()
	f, err := os.Create(path)
	require.NoError(tb, err)
	w := bufio.NewWriter(f)
	for _, r := range rows {
		require.NoError(tb, binary.Write(w, binary.NativeEndian, r))
	}
	require.NoError(tb, w.Flush())
	require.NoError(tb, f.Close())
}
