package monitoring_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/promtest"
	"github.com/tfdist/tfdist/monitoring"
)

// A scrape over HTTP finds every metric, labelled with the task; the
// counters grow between two scrapes, and the step-time histogram counts
// exactly the steps run.
func TestScrapeFindsEveryMetric(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := monitoring.New("worker:1")
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	require.NoError(t, err)

	step := func(n int) {
		for range n {
			m.Step(32, 3*time.Millisecond, time.Now())
			m.AllReducedBytes.Add(4096)
			m.AllReduceSeconds.Observe(0.001)
			m.InputWaitSeconds.Observe(0.0001)
		}
		m.Loss.Set(0.25)
		m.LearningRate.Set(0.1)
		m.CheckpointSeconds.Set(0.5)
		m.StragglerScore.WithLabelValues("0").Set(1)
		m.StragglerScore.WithLabelValues("1").Set(0.5)
	}
	step(5)
	m.Restarts.Inc()
	m.CollectiveTimeouts.Inc()
	first := promtest.Scrape(t, addr.String())
	step(7)
	second := promtest.Scrape(t, addr.String())

	for _, name := range []string{"steps_total", "examples_total", "allreduced_bytes_total", "restarts_total",
		"collective_timeouts_total", "step_seconds", "allreduce_seconds", "input_wait_seconds", "loss", "learning_rate",
		"last_step_timestamp_seconds", "checkpoint_seconds", "straggler_score", "workers", "memberships_total"} {
		f, ok := second["tfdist_"+name]
		if !assert.True(t, ok, "tfdist_%s is served", name) {
			continue
		}
		assert.Equal(t, "worker:1", promtest.Label(f.Metric[0], "task"), name)
	}
	for _, name := range []string{"tfdist_steps_total", "tfdist_examples_total", "tfdist_allreduced_bytes_total"} {
		assert.Greater(t, second[name].Metric[0].GetCounter().GetValue(), first[name].Metric[0].GetCounter().GetValue(), name)
	}
	assert.EqualValues(t, 12, second["tfdist_steps_total"].Metric[0].GetCounter().GetValue())
	assert.EqualValues(t, 12, second["tfdist_step_seconds"].Metric[0].GetHistogram().GetSampleCount(), "one observation per step")
	assert.EqualValues(t, 12*32, second["tfdist_examples_total"].Metric[0].GetCounter().GetValue())
	assert.Len(t, second["tfdist_straggler_score"].Metric, 2, "a score per worker")
}

// An address already in use is an error that names it.
func TestAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	_, err = monitoring.New("worker:0").Serve(context.Background(), ln.Addr().String())
	require.Error(t, err)
	assert.ErrorContains(t, err, ln.Addr().String())
}
