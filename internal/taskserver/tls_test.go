package taskserver_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/partition/partitiontest"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/mtls"
)

// intruder returns cfg without its check of the server's certificate: a
// client that wants in whatever the server is.
func intruder(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.VerifyConnection = nil
	return c
}

func refused(t *testing.T, err error) *taskserver.RefusedError {
	t.Helper()
	var re *taskserver.RefusedError
	require.ErrorAs(t, err, &re)
	return re
}

// TestTLSRefusesAnotherJobsCertificate: under TLS a client of the job is
// served, and the audit log records it with its certificate; a client
// presenting a certificate of another job, of another CA or of the job's
// CA, is refused at the handshake, and the audit log records why and the
// certificate (by the time the client's call fails).
func TestTLSRefusesAnotherJobsCertificate(t *testing.T) {
	cfgs := tlsConfigs(t, "job-a")
	log, logs := auditLog()
	n := start(t, "127.0.0.1:0", taskserver.WithTLS(cfgs[partitiontest.PS0]), taskserver.WithLogger(log))
	ctx := context.Background()
	_, err := client(t, n.addr, taskserver.WithTLS(cfgs["chief"])).Ping(ctx)
	require.NoError(t, err)
	joined := logs.FilterLoggerName("audit").FilterMessage("peer joined").All()
	require.Len(t, joined, 1)
	assert.Equal(t, "tfdist://job-a/chief/0", joined[0].ContextMap()["cert_identity"])
	assert.NotEmpty(t, joined[0].ContextMap()["cert_sha256"])

	// The server's alert may reach the client, or be lost in the reset of
	// the connection the server closed: the client learns only that it
	// failed; the audit log has why.
	_, err = client(t, n.addr, taskserver.WithTLS(intruder(tlsConfigs(t, "job-b")["chief"]))).Ping(ctx)
	require.Error(t, err)
	records := logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	require.Len(t, records, 1)
	assert.Contains(t, records[0].ContextMap()["reason"], "TLS handshake: not signed by the job's CA")
	assert.Equal(t, "tfdist://job-b/chief/0", records[0].ContextMap()["cert_identity"])

	a, err := mtls.NewAuthority("test CA", time.Hour)
	require.NoError(t, err)
	log, logs = auditLog()
	n = start(t, "127.0.0.1:0", taskserver.WithTLS(issue(t, a, mtls.Identity{Job: "job-a", Task: taskOf(partitiontest.PS0)})), taskserver.WithLogger(log))
	_, err = client(t, n.addr, taskserver.WithTLS(intruder(issue(t, a, mtls.Identity{Job: "job-b", Task: taskOf("chief")})))).Ping(ctx)
	require.Error(t, err)
	records = logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	require.Len(t, records, 1)
	assert.Contains(t, records[0].ContextMap()["reason"], `certificate names chief:0, a task of job "job-b"; this task's job is "job-a"`)
	assert.Equal(t, "tfdist://job-b/chief/0", records[0].ContextMap()["cert_identity"])
}

// TestTLSClientRefusesAnotherJobsServer: a client checks the server's
// certificate too, and refuses a server of another job.
func TestTLSClientRefusesAnotherJobsServer(t *testing.T) {
	n := start(t, "127.0.0.1:0", taskserver.WithTLS(tlsConfigs(t, "job-a")[partitiontest.PS0]))
	_, err := client(t, n.addr, taskserver.WithTLS(tlsConfigs(t, "job-b")["chief"])).Ping(context.Background())
	re := refused(t, err)
	assert.Contains(t, re.Reason, "TLS handshake: not signed by the job's CA")
	assert.Equal(t, n.addr, re.Addr)
}

// TestTLSAndPlaintextDoNotMix: a plaintext client of a TLS server, and a
// TLS client of a plaintext server, fail saying so.
func TestTLSAndPlaintextDoNotMix(t *testing.T) {
	cfgs := tlsConfigs(t, "job-a")
	ctx := context.Background()
	secure := start(t, "127.0.0.1:0", taskserver.WithTLS(cfgs[partitiontest.PS0]))
	_, err := client(t, secure.addr).Ping(ctx)
	assert.Contains(t, refused(t, err).Reason, "Client sent an HTTP request to an HTTPS server")

	plain := start(t, "127.0.0.1:0")
	_, err = client(t, plain.addr, taskserver.WithTLS(cfgs["chief"])).Ping(ctx)
	assert.Contains(t, refused(t, err).Reason, "does the server run without TLS?")
}

// TestTLSChecksTheTaskAtEachAddress: the worker's server checks that the
// server it reaches for a task of the plan has that task's certificate: a
// plan that gives ps:0 the address of ps:1 fails, naming ps:0. (The
// variables are initialised first, so that ps:1's part of the plan, run
// at the same time, succeeds: the refusal is the plan's only error.)
func TestTLSChecksTheTaskAtEachAddress(t *testing.T) {
	cfgs := tlsConfigs(t, "job-a")
	s := newServers(t, func(task string) []taskserver.Option { return []taskserver.Option{taskserver.WithTLS(cfgs[task])} })
	m := partitiontest.NewModel(t)
	s.run(s.install(m.InitPlan(t)), nil)
	p := m.ReadPlan(t)
	ctx := context.Background()
	for task, frag := range p.Fragments {
		require.NoError(t, s.clients[task].Import(ctx, "read", frag))
	}
	addrs := s.addrs()
	addrs[partitiontest.PS0] = addrs[partitiontest.PS1]
	require.NoError(t, s.clients[partitiontest.Worker].InstallPlan(ctx, "read", p, addrs))
	_, err := s.clients[partitiontest.Worker].RunPlan(ctx, "read", nil)
	var re *partition.RunError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, partitiontest.PS0, re.Task)
	assert.Contains(t, refused(t, err).Reason, "certificate names ps:1; the cluster has ps:0 at this address")
	assert.Equal(t, cluster.Task{Type: cluster.PS}, taskOf(partitiontest.PS0))
}
