package monitoring_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	dto "github.com/prometheus/client_model/go"

	"github.com/tfdist/tfdist/monitoring"
)

// scrape reads the metrics served at addr, by name.
func scrape(t *testing.T, addr net.Addr) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/metrics", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	return fams
}

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
	first := scrape(t, addr)
	step(7)
	second := scrape(t, addr)

	for _, name := range []string{"steps_total", "examples_total", "allreduced_bytes_total", "restarts_total",
		"collective_timeouts_total", "step_seconds", "allreduce_seconds", "input_wait_seconds", "loss", "learning_rate",
		"last_step_timestamp_seconds", "checkpoint_seconds", "straggler_score"} {
		f, ok := second["tfdist_"+name]
		if !assert.True(t, ok, "tfdist_%s is served", name) {
			continue
		}
		assert.Equal(t, "worker:1", label(f.Metric[0], "task"), name)
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

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
