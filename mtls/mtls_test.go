package mtls_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
)

func worker(job string, i int) mtls.Identity {
	return mtls.Identity{Job: job, Task: cluster.Task{Type: cluster.Worker, Index: i}}
}

func authority(t *testing.T) *mtls.Authority {
	a, err := mtls.NewAuthority("test CA", time.Hour)
	require.NoError(t, err)
	return a
}

func issue(t *testing.T, a *mtls.Authority, ids ...mtls.Identity) []mtls.Files {
	now := time.Now()
	fs, err := a.Write(t.TempDir(), ids, now.Add(-time.Minute), now.Add(time.Hour))
	require.NoError(t, err)
	return fs
}

func write(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "file.pem")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// WriteTasks gives every task of a cluster its own certificate, naming
// it, in files only their owner may read.
func TestWriteTasksNamesEveryTask(t *testing.T) {
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2", "127.0.0.1:3"}, cluster.PS: {"127.0.0.1:4"}})
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "certs")
	files, err := mtls.WriteTasks(dir, "job-1", spec.Tasks(), time.Hour)
	require.NoError(t, err)
	require.Len(t, files, 4)
	for task, f := range files {
		c, err := mtls.Load(f)
		require.NoError(t, err, task)
		assert.Equal(t, mtls.Identity{Job: "job-1", Task: task}, c.Identity())
		for _, p := range []string{f.Cert, f.Key, filepath.Join(dir, "ca.key")} {
			fi, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), p)
		}
	}
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
}

// Every file that cannot serve is an error at Load naming the file and
// what is wrong with it.
func TestLoadNamesWhatIsWrong(t *testing.T) {
	a := authority(t)
	good := issue(t, a, worker("job", 0), worker("job", 1))
	now := time.Now()
	expired, err := a.Write(t.TempDir(), []mtls.Identity{worker("job", 0)}, now.Add(-time.Hour), now.Add(-time.Minute))
	require.NoError(t, err)
	other := issue(t, authority(t), worker("job", 0))[0]
	garbage := write(t, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
	empty := write(t, "")
	dir := t.TempDir()
	cases := []struct {
		name  string
		files mtls.Files
		want  []string
	}{
		{"missing CA", mtls.Files{CA: filepath.Join(dir, "nope.crt"), Cert: good[0].Cert, Key: good[0].Key}, []string{"CA file", "nope.crt", "no such file"}},
		{"unreadable certificate", mtls.Files{CA: good[0].CA, Cert: dir, Key: good[0].Key}, []string{"certificate file", dir, "is a directory"}},
		{"CA with no certificates", mtls.Files{CA: empty, Cert: good[0].Cert, Key: good[0].Key}, []string{"CA file", empty, "holds no PEM certificates"}},
		{"a key as CA", mtls.Files{CA: good[0].Key, Cert: good[0].Cert, Key: good[0].Key}, []string{"CA file", good[0].Key, "holds no PEM certificates"}},
		{"task certificate as CA", mtls.Files{CA: good[1].Cert, Cert: good[0].Cert, Key: good[0].Key}, []string{"CA file", "is not a CA certificate"}},
		{"malformed certificate", mtls.Files{CA: good[0].CA, Cert: garbage, Key: good[0].Key}, []string{"certificate file", garbage, "PEM block 1"}},
		{"no certificate", mtls.Files{CA: good[0].CA, Cert: empty, Key: good[0].Key}, []string{"certificate file", empty, "holds no PEM certificate"}},
		{"malformed key", mtls.Files{CA: good[0].CA, Cert: good[0].Cert, Key: garbage}, []string{"key file", garbage, "holds no PEM private key"}},
		{"key of another certificate", mtls.Files{CA: good[0].CA, Cert: good[0].Cert, Key: good[1].Key}, []string{good[1].Key, "does not match certificate file", good[0].Cert}},
		{"expired", expired[0], []string{expired[0].Cert, "expired at"}},
		{"another CA", mtls.Files{CA: good[0].CA, Cert: other.Cert, Key: other.Key}, []string{other.Cert, "not signed by the job's CA"}},
		{"a file not named", mtls.Files{CA: good[0].CA, Cert: good[0].Cert}, []string{"must all be named"}},
	}
	for _, c := range cases {
		_, err := mtls.Load(c.files)
		require.Error(t, err, c.name)
		for _, w := range c.want {
			assert.ErrorContains(t, err, w, c.name)
		}
	}
}

// A certificate that names no task is refused at Load, naming the file,
// and so are malformed task names.
func TestLoadRefusesACertificateThatNamesNoTask(t *testing.T) {
	f := untaskedCertificate(t)
	_, err := mtls.Load(f)
	assert.ErrorContains(t, err, f.Cert)
	assert.ErrorContains(t, err, `names no task: expected a URI SAN tfdist://<job>/<task type>/<task index>`)

	_, err = mtls.ParseIdentity(mustURL(t, "tfdist://job/worker"))
	assert.ErrorContains(t, err, "path has no task type and index")
	_, err = mtls.ParseIdentity(mustURL(t, "tfdist://job/boss/1"))
	assert.ErrorContains(t, err, `type "boss"`)
	_, err = mtls.ParseIdentity(mustURL(t, "tfdist://Job_1/worker/1"))
	assert.ErrorContains(t, err, `job name "Job_1"`)
	id, err := mtls.ParseIdentity(mustURL(t, "tfdist://job-1/ps/3"))
	require.NoError(t, err)
	assert.Equal(t, mtls.Identity{Job: "job-1", Task: cluster.Task{Type: cluster.PS, Index: 3}}, id)
}

// untaskedCertificate writes a certificate signed by a job's CA, valid and
// for both usages, that names a host but no task.
func untaskedCertificate(t *testing.T) mtls.Files {
	a := authority(t)
	fs := issue(t, a, worker("job", 0))
	caKey, err := a.KeyPEM()
	require.NoError(t, err)
	blk, _ := pem.Decode(caKey)
	signer, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	require.NoError(t, err)
	blk, _ = pem.Decode(a.CertPEM())
	caCert, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "worker:0"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, DNSNames: []string{"worker-0.job"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, signer)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return mtls.Files{CA: fs[0].CA, Cert: write(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))),
		Key: write(t, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

// The environment names the three files together, or none.
func TestFilesFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	f, ok, err := mtls.FilesFromEnv(env(nil))
	require.NoError(t, err)
	assert.False(t, ok)
	assert.True(t, f.IsZero())
	f, ok, err = mtls.FilesFromEnv(env(map[string]string{mtls.EnvCA: "ca", mtls.EnvCert: "c", mtls.EnvKey: "k"}))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, mtls.Files{CA: "ca", Cert: "c", Key: "k"}, f)
	_, _, err = mtls.FilesFromEnv(env(map[string]string{mtls.EnvCA: "ca"}))
	assert.ErrorContains(t, err, "[TFDIST_TLS_CERT TFDIST_TLS_KEY] not")
	req, err := mtls.RequiredFromEnv(env(map[string]string{mtls.EnvRequire: "1"}))
	require.NoError(t, err)
	assert.True(t, req)
	_, err = mtls.RequiredFromEnv(env(map[string]string{mtls.EnvRequire: "yes please"}))
	assert.ErrorContains(t, err, `TFDIST_REQUIRE_TLS="yes please": expected a boolean`)
}

// handshake connects a client expecting want (its configuration's
// ServerName) to a server over a pipe and returns each side's error and
// what each saw of the other.
func handshake(t *testing.T, client, server *mtls.Credentials, want string) (cp, sp mtls.Peer, cerr, serr error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc := tls.Server(b, server.Config())
		serr = tc.HandshakeContext(ctx)
		sp = presented(tc)
		if serr == nil {
			_, serr = tc.Write([]byte("x"))
		}
	}()
	cfg := client.Config().Clone()
	cfg.ServerName = want
	tc := tls.Client(a, cfg)
	cerr = tc.HandshakeContext(ctx)
	cp = presented(tc)
	if cerr == nil {
		_, cerr = tc.Read(make([]byte, 1))
	}
	if cerr != nil {
		_ = a.Close()
	}
	<-done
	return cp, sp, cerr, serr
}

// presented describes the certificate the peer presented on tc, if any.
func presented(tc *tls.Conn) mtls.Peer {
	if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
		return mtls.PeerOf(certs[0])
	}
	return mtls.Peer{}
}

func load(t *testing.T, f mtls.Files) *mtls.Credentials {
	c, err := mtls.Load(f)
	require.NoError(t, err)
	return c
}

// Both ends check the other: the task at the address the client dialled,
// and the job. (A server refusing a client of another job is in package
// collective's tests.)
func TestHandshakeChecksBothEnds(t *testing.T) {
	a := authority(t)
	fs := issue(t, a, worker("job", 0), worker("job", 1))
	w0, w1, foreign := load(t, fs[0]), load(t, fs[1]), load(t, issue(t, a, worker("other", 1))[0])

	cp, sp, cerr, serr := handshake(t, w1, w0, "worker:0")
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.Equal(t, worker("job", 0), cp.Identity)
	assert.Equal(t, worker("job", 1), sp.Identity)

	cp, _, cerr, _ = handshake(t, w1, w0, "worker:2")
	assert.ErrorContains(t, cerr, "certificate names worker:0; the cluster has worker:2 at this address")
	assert.Equal(t, worker("job", 0), cp.Identity)

	cp, _, cerr, _ = handshake(t, foreign, w0, "worker:0")
	assert.ErrorContains(t, cerr, `certificate names worker:0, a task of job "job"; this task's job is "other"`)
	assert.Equal(t, worker("job", 0), cp.Identity)
}

// New files take effect at the next handshake without a restart; files
// that no longer serve are logged and the previous ones kept.
func TestCredentialsReloadWhenFilesChange(t *testing.T) {
	a := authority(t)
	fs := issue(t, a, worker("job", 0), worker("job", 1))
	w0, w1 := load(t, fs[0]), load(t, fs[1])
	first, _, _, _ := handshake(t, w1, w0, "worker:0")
	require.True(t, first.Presented())

	fresh := issue(t, a, worker("job", 0))[0]
	for _, p := range [][2]string{{fresh.Cert, fs[0].Cert}, {fresh.Key, fs[0].Key}} {
		b, err := os.ReadFile(p[0])
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p[1], b, 0o600))
	}
	second, _, cerr, serr := handshake(t, w1, w0, "worker:0")
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.NotEqual(t, first.Fingerprint, second.Fingerprint, "the new certificate is presented")

	require.NoError(t, os.WriteFile(fs[0].Cert, []byte("garbage"), 0o600))
	third, _, cerr, serr := handshake(t, w1, w0, "worker:0")
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.Equal(t, second.Fingerprint, third.Fingerprint, "a broken file keeps the last good certificate")
}
