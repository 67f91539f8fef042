// Package monitoring exposes a training job's progress to Prometheus: steps,
// examples and bytes all-reduced (counters); step time, all-reduce time and
// input wait (histograms); loss, learning rate, the last step's time,
// restarts, collective timeouts, checkpoint time and straggler scores
// (gauges). Metrics live in a registry of their own, never the global one;
// Serve exposes it over HTTP for a Prometheus server to scrape.
package monitoring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Env is the environment variable that gives the address a task serves
// its metrics on: tfdist launch --metrics sets it for each task, and the
// multi-worker strategy reads it as it reads TF_CONFIG.
const Env = "TFDIST_METRICS_ADDR"

// Metrics are one process's metrics, labelled with its task.
type Metrics struct {
	reg *prometheus.Registry

	Steps              prometheus.Counter
	Examples           prometheus.Counter
	AllReducedBytes    prometheus.Counter
	Restarts           prometheus.Counter
	CollectiveTimeouts prometheus.Counter
	StepSeconds        prometheus.Histogram
	AllReduceSeconds   prometheus.Histogram
	InputWaitSeconds   prometheus.Histogram
	Loss               prometheus.Gauge
	LearningRate       prometheus.Gauge
	LastStep           prometheus.Gauge
	CheckpointSeconds  prometheus.Gauge
	StragglerScore     *prometheus.GaugeVec
	Workers            prometheus.Gauge
	Memberships        prometheus.Counter
	Syncs              prometheus.Counter
}

// New returns the metrics of task ("worker:1"), registered in a registry
// of their own.
func New(task string) *Metrics {
	labels := prometheus.Labels{"task": task}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tfdist", Name: name, Help: help, ConstLabels: labels})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tfdist", Name: name, Help: help, ConstLabels: labels})
	}
	histogram := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "tfdist", Name: name, Help: help, ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(1e-4, 2, 20)}) // 0.1 ms to about 52 s
	}
	m := &Metrics{
		reg:                prometheus.NewRegistry(),
		Steps:              counter("steps_total", "Training steps run."),
		Examples:           counter("examples_total", "Examples trained on."),
		AllReducedBytes:    counter("allreduced_bytes_total", "Bytes of this task's all-reduces and reduce-scatters."),
		Restarts:           counter("restarts_total", "Times the job restarted from a checkpoint."),
		CollectiveTimeouts: counter("collective_timeouts_total", "Collectives that timed out waiting for a peer."),
		StepSeconds:        histogram("step_seconds", "Time of a training step."),
		AllReduceSeconds:   histogram("allreduce_seconds", "Time of an all-reduce or a reduce-scatter."),
		InputWaitSeconds:   histogram("input_wait_seconds", "Time a step waited for its input."),
		Loss:               gauge("loss", "The last step's loss."),
		LearningRate:       gauge("learning_rate", "The optimizer's learning rate at the last step."),
		LastStep:           gauge("last_step_timestamp_seconds", "When the last step ended, in seconds since the Unix epoch."),
		CheckpointSeconds:  gauge("checkpoint_seconds", "Time of the last checkpoint's save."),
		StragglerScore: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "tfdist", Name: "straggler_score", ConstLabels: labels,
			Help: "Each worker's speed relative to the fastest worker's, 1 for the fastest."}, []string{"worker"}),
		Workers:     gauge("workers", "The workers of this worker's membership (an elastic job's)."),
		Memberships: counter("memberships_total", "The memberships this worker trained in: one, then one more per change of an elastic job's."),
		Syncs:       counter("local_sgd_syncs_total", "The synchronisations of local SGD or DiLoCo this worker took part in."),
	}
	m.reg.MustRegister(m.Steps, m.Examples, m.AllReducedBytes, m.Restarts, m.CollectiveTimeouts,
		m.StepSeconds, m.AllReduceSeconds, m.InputWaitSeconds,
		m.Loss, m.LearningRate, m.LastStep, m.CheckpointSeconds, m.StragglerScore, m.Workers, m.Memberships, m.Syncs)
	return m
}

// Registry returns the registry the metrics are in, for a program to add
// its own or to serve them its own way.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Step records a step of examples examples that took d and ended at end.
func (m *Metrics) Step(examples int, d time.Duration, end time.Time) {
	m.Steps.Inc()
	m.Examples.Add(float64(examples))
	m.StepSeconds.Observe(d.Seconds())
	m.LastStep.Set(float64(end.UnixNano()) / 1e9)
}

// Serve listens on addr and serves the metrics at /metrics until ctx
// ends. It returns the address it listens on once it does, or an error
// naming addr (already in use, say).
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("monitoring: serve metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = ln.Close()
		}
	}()
	return ln.Addr(), nil
}
