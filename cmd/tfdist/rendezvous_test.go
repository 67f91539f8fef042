package main

import (
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/elastic"
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
