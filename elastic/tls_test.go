package elastic_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/mtls"
)

// certificates writes a CA of job "j" and the certificates of the
// rendezvous and of worker:0 and worker:1.
func certificates(t *testing.T) map[cluster.Task]mtls.Files {
	files, err := mtls.WriteTasks(t.TempDir(), "j", []cluster.Task{mtls.RendezvousTask,
		{Type: cluster.Worker, Index: 0}, {Type: cluster.Worker, Index: 1}}, time.Hour)
	require.NoError(t, err)
	return files
}

// withCertificate joins with the certificate of f.
func withCertificate(t *testing.T, f mtls.Files) elastic.JoinOption {
	cfg, err := mtls.LoadConfig(f)
	require.NoError(t, err)
	return elastic.WithClientTLS(cfg)
}

// A rendezvous that serves mutual TLS admits a worker whose certificate
// names it, and refuses, with the reason, one whose certificate names
// another worker and one that speaks plaintext. A rendezvous's own
// certificate must name mtls.RendezvousTask.
func TestTLSAdmitsWorkersAsTheirCertificatesNameThem(t *testing.T) {
	files := certificates(t)
	worker0 := files[cluster.Task{Type: cluster.Worker, Index: 0}]
	rdzv, err := mtls.LoadConfig(files[mtls.RendezvousTask])
	require.NoError(t, err)
	srv := serve(t, elastic.WithJob("j"), elastic.WithTLS(rdzv))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	m, err := elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "worker:0"}, withCertificate(t, worker0))
	require.NoError(t, err)
	defer m.Close()

	_, err = elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "worker:1"}, withCertificate(t, worker0))
	var refused *elastic.RefusedError
	require.True(t, errors.As(err, &refused), "%v", err)
	assert.Contains(t, refused.Reason, `its certificate names tfdist://j/worker/0, but its hello names "worker:1"`)

	_, err = elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "worker:1"})
	require.Error(t, err, "a plaintext worker joined a rendezvous that serves TLS")
	assert.False(t, errors.As(err, &refused))

	workerCfg, err := mtls.LoadConfig(worker0)
	require.NoError(t, err)
	_, err = elastic.Listen("127.0.0.1:0", elastic.WithTLS(workerCfg))
	assert.ErrorContains(t, err, "elastic: WithTLS: the certificate names tfdist://j/worker/0; a rendezvous's must name rendezvous:0")
}

// JoinFromEnv joins over TLS when the environment names a worker's
// certificate files, as the worker its certificate names unless
// TFDIST_WORKER names it.
func TestJoinFromEnvUsesTheCertificate(t *testing.T) {
	files := certificates(t)
	rdzv, err := mtls.LoadConfig(files[mtls.RendezvousTask])
	require.NoError(t, err)
	srv := serve(t, elastic.WithJob("j"), elastic.WithTLS(rdzv))
	f := files[cluster.Task{Type: cluster.Worker, Index: 1}]
	t.Setenv(elastic.EnvRendezvous, srv.Addr())
	t.Setenv(elastic.EnvJob, "j")
	t.Setenv(elastic.EnvName, "")
	for _, kv := range f.Env(true) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := elastic.JoinFromEnv(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, "worker:1", m.Name())
	require.NoError(t, m.Close())

	t.Setenv(mtls.EnvCA, "")
	t.Setenv(mtls.EnvCert, "")
	t.Setenv(mtls.EnvKey, "")
	t.Setenv(elastic.EnvName, "worker:1")
	_, err = elastic.JoinFromEnv(ctx, 0)
	assert.ErrorContains(t, err, "TFDIST_REQUIRE_TLS is set but no certificate is configured")
}
