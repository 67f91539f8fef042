package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/mtls"
)

// tfdist rendezvous forms the memberships of the workers that join it and
// exits 0 once they have finished.
func TestRendezvousServesAJobToItsEnd(t *testing.T) {
	cmd, _, stderr := tfdist(t, nil, "rendezvous", "--listen", "127.0.0.1:0", "--job", "j", "--min-workers", "2", "--max-workers", "2")
	require.NoError(t, cmd.Start())
	serving := regexp.MustCompile(`serving on (\S+)`)
	require.Eventually(t, func() bool { return serving.MatchString(stderr.String()) }, time.Minute, 10*time.Millisecond)
	addr := serving.FindStringSubmatch(stderr.String())[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ms []*elastic.Member
	for _, name := range []string{"worker:0", "worker:1"} {
		m, err := elastic.Join(ctx, addr, elastic.Hello{Job: "j", Name: name})
		require.NoError(t, err)
		ms = append(ms, m)
	}
	_, err := elastic.Join(ctx, addr, elastic.Hello{Job: "other", Name: "x"})
	assert.ErrorContains(t, err, `it belongs to job "other"; this is job "j"`)
	got := make(chan elastic.Membership, 2)
	for _, m := range ms {
		go func() {
			mb, err := m.Next(ctx, elastic.Report{Addr: "127.0.0.1:1"})
			assert.NoError(t, err)
			got <- mb
		}()
	}
	for range ms {
		mb := <-got
		assert.Len(t, mb.Members, 2)
	}
	for _, m := range ms {
		require.NoError(t, m.Leave(true))
	}
	assert.Equal(t, 0, exitCode(t, cmd, time.Minute), "%s", stderr)
	assert.Contains(t, stderr.String(), "membership formed")
}

func TestRendezvousBadFlags(t *testing.T) {
	code, _, stderr := runHere(nil, "", "rendezvous", "--min-workers", "3", "--max-workers", "2")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--min-workers 3, --max-workers 2: expected 1 <= min <= max")
	code, _, stderr = runHere(nil, "", "rendezvous", "--max-workers", "4", "--sizes", "1,x")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `--sizes "1,x": "x" is not a worker count`)
	dir := t.TempDir()
	code, _, stderr = runHere(nil, "", "rendezvous", "--replay", filepath.Join(dir, "none.log"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--replay "+filepath.Join(dir, "none.log")+": open")
	log := filepath.Join(dir, "new.log")
	code, _, stderr = runHere(nil, "", "rendezvous", "--listen", "nohost:x", "--membership-log", log)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "listen on nohost:x")
	assert.NoFileExists(t, log, "a log never written is not left behind")
}

// tfdist cert --elastic-workers makes the certificates of an elastic job,
// and tfdist rendezvous, given its own by the environment, serves mutual
// TLS: it admits a worker whose certificate names it, and refuses to
// serve with a worker's certificate.
func TestRendezvousOverTLS(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runHere(nil, "", "cert", "--out", dir, "--job", "j", "--elastic-workers", "2")
	require.Equal(t, exitOK, code, errOut)
	files := func(base string) mtls.Files {
		return mtls.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, base+".crt"), Key: filepath.Join(dir, base+".key")}
	}
	for _, base := range []string{"rendezvous-0", "worker-0", "worker-1"} {
		assert.Contains(t, out, mtls.EnvCert+"="+files(base).Cert)
	}

	cmd, _, stderr := tfdist(t, files("rendezvous-0").Env(true), "rendezvous", "--listen", "127.0.0.1:0", "--job", "j")
	require.NoError(t, cmd.Start())
	serving := regexp.MustCompile(`serving on (\S+)`)
	require.Eventually(t, func() bool { return serving.MatchString(stderr.String()) }, time.Minute, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := mtls.LoadConfig(files("worker-1"))
	require.NoError(t, err)
	m, err := elastic.Join(ctx, serving.FindStringSubmatch(stderr.String())[1], elastic.Hello{Job: "j", Name: "worker:1"}, elastic.WithClientTLS(cfg))
	require.NoError(t, err)
	_, err = m.Next(ctx, elastic.Report{Addr: "127.0.0.1:1"})
	require.NoError(t, err)
	require.NoError(t, m.Leave(true))
	assert.Equal(t, 0, exitCode(t, cmd, time.Minute), "%s", stderr)

	env := map[string]string{}
	for _, kv := range files("worker-0").Env(false) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	code, _, errOut = runHere(env, "", "rendezvous", "--listen", "127.0.0.1:0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "the certificate names tfdist://j/worker/0; a rendezvous's must name rendezvous:0")
	code, _, errOut = runHere(nil, "", "cert", "--out", dir, "--job", "j", "--elastic-workers", "2", "--file", "x.json")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--elastic-workers 2: expected a number of workers, and no --file")
}
