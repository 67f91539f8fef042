package train_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/promtest"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/timeline"
	"github.com/tfdist/tfdist/train"
)

// traceEvent is what the tests read of a Chrome trace event.
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func workerOptions(more ...multiworker.Option) []multiworker.Option {
	return append([]multiworker.Option{multiworker.WithLogicalCPUs(1),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, more...)
}

// Two workers' timelines merge into one Chrome trace with a track per
// task on one clock: each collective runs at the same time on both, and
// each step's input and compute add up to the step.
func TestTimelineOfTwoWorkers(t *testing.T) {
	ctx := context.Background()
	recs := []*timeline.Recorder{timeline.New(0), timeline.New(0)}
	errs := testcluster.OnWorkersWith(testcluster.LoopbackSpec(t, 2),
		func(w int) []multiworker.Option { return workerOptions(multiworker.WithTimeline(recs[w])) },
		func(w int, s *multiworker.Strategy) error {
			ds, _ := overfitting(t)
			_, err := compiled(t, s).Fit(ctx, ds, train.Epochs(1), train.StepsPerEpoch(10))
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	var traces [2]bytes.Buffer
	for w := range traces {
		require.NoError(t, timeline.Write(&traces[w], recs[w], fmt.Sprintf("worker:%d", w), 100+w))
	}
	var merged bytes.Buffer
	require.NoError(t, timeline.Merge(&merged, &traces[0], &traces[1]))
	var file struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(merged.Bytes(), &file), "Chrome trace JSON")

	steps := map[int]map[string]traceEvent{}       // by task, step name
	collectives := map[int]map[string]traceEvent{} // by task, op name
	children := map[int][]traceEvent{}
	for _, e := range file.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		byName := func(m map[int]map[string]traceEvent) {
			if m[e.PID] == nil {
				m[e.PID] = map[string]traceEvent{}
			}
			m[e.PID][e.Name] = e
		}
		switch timeline.Phase(e.Cat) {
		case timeline.Step:
			byName(steps)
		case timeline.Collective:
			byName(collectives)
			if e.Args["op"] == "all-reduce" {
				assert.Positive(t, e.Args["bytes"], e.Name)
			}
		case timeline.Input, timeline.Compute:
			children[e.PID] = append(children[e.PID], e)
		}
	}
	for pid := range 2 {
		require.Len(t, steps[pid], 10, "a step span per step on task %d", pid)
		for name, st := range steps[pid] {
			sum := 0.0
			for _, c := range children[pid] {
				if c.TS >= st.TS-1 && c.TS+c.Dur <= st.TS+st.Dur+1 { // µs, rounded

					sum += c.Dur
				}
			}
			assert.InDelta(t, st.Dur, sum, 3, "task %d %s: input and compute add up to the step (µs, each rounded)", pid, name)
		}
		require.NotEmpty(t, collectives[pid], "task %d has collective spans", pid)
	}
	for name, a := range collectives[0] {
		b, ok := collectives[1][name]
		require.True(t, ok, "%s on both tasks", name)
		assert.True(t, a.TS <= b.TS+b.Dur && b.TS <= a.TS+a.Dur, "%s overlaps on both tasks: one clock", name)
	}
}

// slowed delays every element of ds by d.
type slowed struct {
	dataset.Dataset
	d time.Duration
}

func (s slowed) Iterator(ctx context.Context) (dataset.Iterator, error) {
	it, err := s.Dataset.Iterator(ctx)
	return slowIterator{it, s.d}, err
}

type slowIterator struct {
	dataset.Iterator
	d time.Duration
}

func (s slowIterator) Next(ctx context.Context) (dataset.Element, error) {
	time.Sleep(s.d)
	return s.Iterator.Next(ctx)
}

// sleepBefore sleeps before every batch of one worker's steps.
type sleepBefore struct {
	train.BaseCallback
	d time.Duration
}

func (s sleepBefore) OnBatchBegin(context.Context, *train.Run, int) error {
	time.Sleep(s.d)
	return nil
}

// A worker slowed on purpose is named in the chief's log as the
// straggler within 20 steps, with the phase that is slow: input when its
// input pipeline is slow, compute when its steps are.
func TestChiefNamesTheStraggler(t *testing.T) {
	for _, phase := range []string{"input", "compute"} {
		t.Run(phase, func(t *testing.T) {
			core, logs := observer.New(zapcore.WarnLevel)
			errs := testcluster.OnWorkersWith(testcluster.LoopbackSpec(t, 2),
				func(w int) []multiworker.Option {
					return workerOptions(multiworker.WithLogger(zap.New(core).With(zap.Int("w", w))))
				},
				func(w int, s *multiworker.Strategy) error {
					d, _ := digitsData(t)
					ds := sliceDS(t, d, 60)
					var cbs []train.Callback
					switch {
					case w == 1 && phase == "input":
						ds = slowed{ds, 2 * time.Millisecond} // 40 ms a batch
					case w == 1:
						cbs = append(cbs, sleepBefore{d: 40 * time.Millisecond})
					}
					_, err := compiled(t, s).Fit(context.Background(), dataset.Batched(ds, 20, false),
						train.Epochs(1), train.StepsPerEpoch(20), train.WithCallbacks(cbs...))
					return err
				})
			for w, err := range errs {
				require.NoError(t, err, "worker %d", w)
			}
			named := logs.FilterMessage("straggler").All()
			require.NotEmpty(t, named, "the chief names a straggler within 20 steps")
			for _, e := range named {
				f := e.ContextMap()
				assert.EqualValues(t, 0, f["w"], "the chief logs it")
				assert.Equal(t, "worker:1", f["straggler"])
				assert.Equal(t, "127.0.0.1", f["host"])
				assert.Equal(t, phase, f["slow_phase"])
				assert.Less(t, f["score"], 0.8)
			}
		})
	}
}

// A worker's metrics endpoint, scraped while it trains, serves every
// metric of a training job; its counters grow from one scrape to the
// next, and its step-time histogram counts every training step run, the
// validation's not.
func TestWorkerServesItsMetrics(t *testing.T) {
	ms := []*monitoring.Metrics{monitoring.New("worker:0"), monitoring.New("worker:1")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := ms[0].Serve(ctx, "127.0.0.1:0")
	require.NoError(t, err)
	var first, second map[string]float64
	var steps int
	errs := testcluster.OnWorkersWith(testcluster.LoopbackSpec(t, 2),
		func(w int) []multiworker.Option { return workerOptions(multiworker.WithMonitoring(ms[w])) },
		func(w int, s *multiworker.Strategy) error {
			tr := compiled(t, s)
			ds, _ := overfitting(t)
			for i := range 2 {
				if _, err := tr.Fit(ctx, ds, train.Epochs(1), train.StepsPerEpoch(10), train.ValidationData(ds), train.ValidationSteps(3)); err != nil {
					return err
				}
				if w == 0 {
					steps += 10
					values := scrapeValues(t, addr.String())
					if i == 0 {
						first = values
					} else {
						second = values
					}
				}
			}
			return nil
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	for _, name := range []string{"steps_total", "examples_total", "allreduced_bytes_total", "restarts_total",
		"collective_timeouts_total", "step_seconds_count", "allreduce_seconds_count", "input_wait_seconds_count", "loss",
		"learning_rate", "last_step_timestamp_seconds", "checkpoint_seconds", "straggler_score{worker:1}"} {
		_, ok := second["tfdist_"+name]
		assert.True(t, ok, "tfdist_%s is served", name)
	}
	for _, name := range []string{"steps_total", "examples_total", "allreduced_bytes_total", "allreduce_seconds_count", "last_step_timestamp_seconds"} {
		assert.Greater(t, second["tfdist_"+name], first["tfdist_"+name], name)
	}
	assert.EqualValues(t, steps, second["tfdist_step_seconds_count"], "the step-time histogram counts every training step")
	assert.EqualValues(t, steps, second["tfdist_steps_total"])
	assert.EqualValues(t, steps*10, second["tfdist_examples_total"], "each worker's share of 20 examples a step")
	assert.Positive(t, second["tfdist_loss"])
}

// scrapeValues returns each served sample's value by name, a histogram's
// count as name_count and a labelled sample as name{value}.
func scrapeValues(t testing.TB, addr string) map[string]float64 {
	out := map[string]float64{}
	for name, f := range promtest.Scrape(t, addr) {
		for _, m := range f.Metric {
			key := name
			if w := promtest.Label(m, "worker"); w != "" {
				key += "{" + w + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key+"_count"] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

// A worker launched with a timeline file and a metrics address in its
// environment serves its metrics while it trains and writes its trace at
// Close; a file it cannot write and an address in use are errors naming
// them, before training.
func TestTimelineAndMetricsFromTheEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.json")
	t.Setenv(timeline.Env, path)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	t.Setenv(monitoring.Env, addr)
	_, err = multiworker.New(context.Background(), multiworker.WithLogicalCPUs(1))
	require.ErrorContains(t, err, addr, "an address in use")
	require.NoError(t, ln.Close())

	s, err := multiworker.New(context.Background(), multiworker.WithLogicalCPUs(1))
	require.NoError(t, err)
	ds, _ := overfitting(t)
	_, err = compiled(t, s).Fit(context.Background(), ds, train.Epochs(2))
	require.NoError(t, err)
	assert.EqualValues(t, 6, scrapeValues(t, addr)["tfdist_steps_total"])
	require.NoError(t, s.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var file struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &file))
	n := 0
	for _, e := range file.TraceEvents {
		if e.Cat == string(timeline.Step) {
			n++
		}
	}
	assert.Equal(t, 6, n, "a step span per step")

	bad := filepath.Join(t.TempDir(), "missing", "worker.json")
	t.Setenv(timeline.Env, bad)
	_, err = multiworker.New(context.Background(), multiworker.WithLogicalCPUs(1))
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), bad), "the error names the path: %v", err)
}

// A run that resumes from its backup counts a restart and shows it on the
// timeline, with its backups' saves, whose time the metrics keep.
func TestResumeIsARestart(t *testing.T) {
	rec, m := timeline.New(0), monitoring.New("worker:0")
	s, err := multiworker.New(context.Background(), multiworker.WithLogicalCPUs(1),
		multiworker.WithTimeline(rec), multiworker.WithMonitoring(m))
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, _ := overfitting(t)
	backup := &train.BackupAndRestore{Dir: t.TempDir(), KeepBackup: true}
	_, err = tr.Fit(context.Background(), ds, train.Epochs(1), train.WithCallbacks(backup))
	require.NoError(t, err)
	_, err = tr.Fit(context.Background(), ds, train.Epochs(2), train.WithCallbacks(&train.BackupAndRestore{Dir: backup.Dir}))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	require.NoError(t, err)
	values := scrapeValues(t, addr.String())
	assert.EqualValues(t, 1, values["tfdist_restarts_total"])
	assert.Positive(t, values["tfdist_checkpoint_seconds"])
	spans, _ := rec.Spans()
	phases := map[timeline.Phase]int{}
	for _, sp := range spans {
		phases[sp.Phase]++
	}
	assert.Equal(t, 1, phases[timeline.Restart], "the resume")
	assert.Equal(t, 2, phases[timeline.Checkpoint], "a backup at the end of each epoch trained")
	assert.Equal(t, 6, phases[timeline.Step], "3 steps an epoch, 2 epochs")
}
