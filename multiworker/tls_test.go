package multiworker_test

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
)

// trainEach trains the MLP on every worker of spec, worker w with
// opts(w), and returns each worker's outcome.
func trainEach(t *testing.T, spec cluster.ClusterSpec, opts func(w int) []multiworker.Option) []testmodel.Outcome {
	t.Helper()
	got := make([]testmodel.Outcome, spec.WorkerCount())
	errs := testcluster.OnWorkersWith(spec, func(w int) []multiworker.Option {
		return append([]multiworker.Option{multiworker.WithLogicalCPUs(2),
			multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, opts(w)...)
	}, func(w int, s *multiworker.Strategy) error {
		var err error
		got[w], err = testmodel.TrainModel(context.Background(), s, "mlp", optimizer.NewSGD(optimizer.Constant(0.1)), 20, 48, 2*w)
		return err
	})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return got
}

// Training over mutual TLS gives the plaintext run's model bit for bit,
// on 2 and 3 workers, and each worker's audit log records its peers
// joining, with their certificates, and leaving in order.
func TestTLSTrainingEqualsPlaintext(t *testing.T) {
	for _, n := range []int{2, 3} {
		spec := loopbackSpec(t, n)
		files, err := mtls.WriteTasks(filepath.Join(t.TempDir(), "certs"), "mw-test", spec.Tasks(), time.Hour)
		require.NoError(t, err)
		plain := trainEach(t, spec, func(int) []multiworker.Option { return nil })

		spec = loopbackSpec(t, n) // fresh ports: certificates name tasks, not addresses
		core, logs := observer.New(zap.InfoLevel)
		secure := trainEach(t, spec, func(w int) []multiworker.Option {
			return []multiworker.Option{multiworker.WithTLS(loadConfig(t, files[cluster.Task{Type: cluster.Worker, Index: w}])),
				multiworker.RequireTLS(), multiworker.WithLogger(zap.New(core))}
		})
		for w := range n {
			assert.Equal(t, plain[w].Params, secure[w].Params, "%d workers: worker %d", n, w)
		}
		joined := logs.FilterLoggerName("audit").FilterMessage("peer joined").FilterField(zap.Bool("tls", true))
		assert.Equal(t, n*(n-1), joined.Len(), "%d workers: every worker records every peer", n)
		assert.Equal(t, n*(n-1), logs.FilterLoggerName("audit").FilterMessage("peer left").Len(), "%d workers: every peer leaves in order", n)
		assert.Zero(t, logs.FilterMessage("peer lost").Len(), "%d workers", n)
	}
}

// Without certificates, or on TensorFlow's collectives, a worker that
// requires TLS refuses to start; a certificate file the environment names
// that cannot serve is an error naming it; each before any connection is
// made.
func TestTLSRequiredOrBrokenFailsAtStart(t *testing.T) {
	spec := loopbackSpec(t, 2)
	files, err := mtls.WriteTasks(filepath.Join(t.TempDir(), "certs"), "mw-test", spec.Tasks(), time.Hour)
	require.NoError(t, err)
	w0 := files[cluster.Task{Type: cluster.Worker, Index: 0}]
	w1 := files[cluster.Task{Type: cluster.Worker, Index: 1}]
	cases := []struct {
		name string
		opts []multiworker.Option
		env  mtls.Files
		want string
	}{
		{"no certificate", []multiworker.Option{multiworker.RequireTLS()}, mtls.Files{}, "TLS is required (RequireTLS or TFDIST_REQUIRE_TLS) but no certificate is configured"},
		{"ring", []multiworker.Option{multiworker.WithTLS(loadConfig(t, w0)), multiworker.RequireTLS(), multiworker.WithCommunication(multiworker.Ring)}, mtls.Files{},
			"TLS is required but not available: communication ring runs over TensorFlow's gRPC server, which takes no TLS"},
		{"missing key", nil, mtls.Files{CA: w0.CA, Cert: w0.Cert, Key: w0.Key + ".missing"}, w0.Key + ".missing"},
		{"another task's certificate", []multiworker.Option{multiworker.WithTLS(loadConfig(t, w1))}, mtls.Files{}, "names tfdist://mw-test/worker/1, but this member is worker:0"},
		{"another task's certificate in the environment", nil, w1, "names tfdist://mw-test/worker/1, but this member is worker:0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !c.env.IsZero() {
				for _, kv := range c.env.Env(false) {
					k, v, _ := strings.Cut(kv, "=")
					t.Setenv(k, v)
				}
			}
			r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Worker, Index: 0})
			require.NoError(t, err)
			start := time.Now()
			_, err = multiworker.New(context.Background(), append(c.opts, multiworker.WithResolver(r), multiworker.WithStartupTimeout(4*time.Minute))...)
			require.ErrorContains(t, err, c.want)
			assert.Less(t, time.Since(start), 2*time.Minute, "fails before waiting for peers (the 4-minute startup timeout)")
		})
	}
}

// loadConfig returns the TLS configuration of the task whose files f names.
func loadConfig(t *testing.T, f mtls.Files) *tls.Config {
	t.Helper()
	cfg, err := mtls.LoadConfig(f)
	require.NoError(t, err)
	return cfg
}
