package collective

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
)

const testJob = "collective-test"

func workerID(job string, i int) mtls.Identity {
	return mtls.Identity{Job: job, Task: cluster.Task{Type: cluster.Worker, Index: i}}
}

// issue writes certificates for ids, signed by a, valid from notBefore to
// notAfter, in a new directory, and returns their files.
func issue(t testing.TB, a *mtls.Authority, notBefore, notAfter time.Time, ids ...mtls.Identity) []mtls.Files {
	t.Helper()
	fs, err := a.Write(t.TempDir(), ids, notBefore, notAfter)
	require.NoError(t, err)
	return fs
}

func newAuthority(t testing.TB) *mtls.Authority {
	t.Helper()
	a, err := mtls.NewAuthority("test CA", time.Hour)
	require.NoError(t, err)
	return a
}

// jobConfigs returns the TLS configurations of workers 0..n-1 of testJob.
func jobConfigs(t testing.TB, a *mtls.Authority, n int) []*tls.Config {
	t.Helper()
	ids := make([]mtls.Identity, n)
	for i := range ids {
		ids[i] = workerID(testJob, i)
	}
	now := time.Now()
	cfgs := make([]*tls.Config, n)
	for i, f := range issue(t, a, now.Add(-time.Minute), now.Add(time.Hour), ids...) {
		c, err := mtls.LoadConfig(f)
		require.NoError(t, err)
		cfgs[i] = c
	}
	return cfgs
}

func withConfigs(cfgs []*tls.Config) func(int) []Option {
	return func(i int) []Option { return []Option{WithTLS(cfgs[i])} }
}

// tlsGroups forms a group of n members over TLS.
func tlsGroups(t testing.TB, a *mtls.Authority, n int, opts ...Option) []*Group {
	t.Helper()
	lns, members := listeners(t, n)
	gs, err := formGroups(lns, members, withConfigs(jobConfigs(t, a, n)), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { closeAll(gs) })
	return gs
}

// sumAll all-reduces each member's buffer of inputs and returns the results.
func sumAll(t *testing.T, gs []*Group, name string, inputs [][]byte) [][]byte {
	t.Helper()
	out := make([][]byte, len(gs))
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		out[i] = bytes.Clone(inputs[i])
		return g.AllReduce(context.Background(), name, Sum, Float32, out[i])
	}))
	return out
}

func randomFloats(r *rand.Rand, n int) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64())))
	}
	return b
}

// Over TLS, 3 members' all-reduces give the same bits as in plaintext, on
// the direct path and on the ring; every member records each peer joining,
// with the peer's certificate, and leaving in order at Close.
func TestTLSAllReduceEqualsPlaintext(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.InfoLevel)
	plain := newGroups(t, 3)
	secure := tlsGroups(t, newAuthority(t), 3, WithLogger(zap.New(core)))
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 1000, 300_001} {
		inputs := make([][]byte, 3)
		for i := range inputs {
			inputs[i] = randomFloats(r, n)
		}
		want := sumAll(t, plain, "grad", inputs)
		got := sumAll(t, secure, "grad", inputs)
		for i := range got {
			require.Equal(t, want[i], got[i], "%d elements, member %d", n, i)
		}
	}
	closeAll(secure)
	joined := logs.FilterLoggerName("audit").FilterMessage("peer joined")
	require.Equal(t, 6, joined.Len(), "each of 3 members sees 2 peers join")
	assert.Equal(t, 6, logs.FilterLoggerName("audit").FilterMessage("peer left").Len(), "each of 3 members sees 2 peers leave in order")
	assert.Zero(t, logs.FilterMessage("peer lost").Len(), "no connection is lost: %v", logs.FilterMessage("peer lost").All())
	for _, e := range joined.All() {
		m := e.ContextMap()
		assert.Equal(t, true, m["tls"])
		assert.Len(t, m["cert_sha256"], 64)
		assert.Contains(t, m["cert_identity"], "tfdist://"+testJob+"/worker/")
		assert.Contains(t, m, "address")
	}
}

// attacker is a client that is not a member: it connects to addr, runs a
// TLS handshake with cert (none: plaintext), sends a hello claiming rank
// claim and returns every byte it then receives until the connection ends.
func attack(t *testing.T, addr string, cert *tls.Certificate, hello []byte) []byte {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer func() { _ = nc.Close() }()
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	conn := nc
	if cert != nil {
		tc := tls.Client(nc, &tls.Config{Certificates: []tls.Certificate{*cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if tc.Handshake() != nil {
			return nil
		}
		conn = tc
	}
	if _, err := conn.Write(hello); err != nil {
		return nil
	}
	got, _ := io.ReadAll(conn)
	return got
}

func loadPair(t *testing.T, f mtls.Files) *tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	return &c
}

// Clients that cannot prove they are the member they claim are refused,
// each with an audit record that says why, while the group trains
// undisturbed; none receives anything but, for a certificate of the job
// naming another task, the reject frame.
func TestTLSRefusesWhoCannotProveTheirTask(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.InfoLevel)
	ca := newAuthority(t)
	gs := tlsGroups(t, ca, 3, WithLogger(zap.New(core)))
	now := time.Now()
	valid := func(a *mtls.Authority, id mtls.Identity) *tls.Certificate {
		return loadPair(t, issue(t, a, now.Add(-time.Minute), now.Add(time.Hour), id)[0])
	}
	attackers := []struct {
		name   string
		cert   *tls.Certificate
		reason string
	}{
		{"plaintext", nil, "first record does not look like a TLS handshake"},
		{"self-signed", valid(newAuthority(t), workerID(testJob, 2)), "not signed by the job's CA"},
		{"another task", valid(ca, workerID(testJob, 1)), "certificate names tfdist://collective-test/worker/1, but the hello claims worker:2"},
		{"another job", valid(ca, workerID("other-job", 2)), `a task of job "other-job"`},
		{"expired", loadPair(t, issue(t, ca, now.Add(-time.Hour), now.Add(-time.Minute), workerID(testJob, 2))[0]), "expired at"},
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	trained := make([]int, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for step := 0; ctx.Err() == nil; step++ {
			requireAllOK(t, onAll(gs, func(i int, g *Group) error {
				buf := make([]byte, 64<<10)
				for k := range len(buf) / 4 {
					binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(float32(i+step)))
				}
				if err := g.AllReduce(context.Background(), "train", Sum, Float32, buf); err != nil {
					return err
				}
				assert.Equal(t, float32(3*step+3), math.Float32frombits(binary.LittleEndian.Uint32(buf[len(buf)-4:])))
				trained[i]++
				return nil
			}))
		}
	}()
	hello := gs[2].hello(kindHello, "")
	for _, a := range attackers {
		got := attack(t, gs[0].members[0].Addr, a.cert, hello)
		if a.name == "another task" {
			pc := newPeerConn(&fakeConn{Reader: bytes.NewReader(got)})
			h, err := pc.readHeader()
			require.NoError(t, err, a.name)
			assert.Equal(t, kindReject, h.kind, a.name)
			continue
		}
		assert.False(t, bytes.Contains(got, hello[:8]), "%s received a frame", a.name)
		if len(got) > 0 {
			assert.Equal(t, byte(0x15), got[0], "%s: only a TLS alert, got %q", a.name, got)
		}
	}
	stop()
	wg.Wait()
	assert.Greater(t, trained[0], 0)
	require.NoError(t, gs[0].Err())

	// A refused client learns of it from the handshake's alert, which the
	// member sends before it writes the audit record.
	refusals := func() []observer.LoggedEntry {
		return logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	}
	require.Eventually(t, func() bool { return len(refusals()) >= len(attackers) }, 10*time.Second, time.Millisecond)
	refused := refusals()
	require.Len(t, refused, len(attackers))
	for _, a := range attackers {
		found := false
		for _, e := range refused {
			m := e.ContextMap()
			if !strings.Contains(m["reason"].(string), a.reason) {
				continue
			}
			found = true
			assert.Contains(t, m, "address", a.name)
			if a.cert != nil {
				assert.Len(t, m["cert_sha256"], 64, a.name)
				assert.NotEmpty(t, m["cert_subject"], a.name)
			}
		}
		assert.True(t, found, "no refusal of the %s client with %q in: %v", a.name, a.reason, refused)
	}
}

// fakeConn reads from a byte slice, to parse frames an attacker received.
type fakeConn struct {
	net.Conn
	io.Reader
}

func (f *fakeConn) Read(p []byte) (int, error) { return f.Reader.Read(p) }

// A member whose certificate names another task fails New at once, naming
// the task the certificate names and the member.
func TestTLSCertificateMustNameTheMember(t *testing.T) {
	noLeaks(t)
	ca := newAuthority(t)
	now := time.Now()
	fs := issue(t, ca, now.Add(-time.Minute), now.Add(time.Hour), workerID(testJob, 1), workerID(testJob, 7))
	for i, want := range []string{
		"names tfdist://collective-test/worker/1, but this member is worker:0",
		"names tfdist://collective-test/worker/7, which is not a member of the group",
	} {
		cfg, err := mtls.LoadConfig(fs[i])
		require.NoError(t, err)
		lns, members := listeners(t, 2)
		_ = lns[1].Close()
		_, err = New(context.Background(), members, 0, WithListener(lns[0]), WithTLS(cfg))
		require.ErrorContains(t, err, "this member's certificate "+want)
	}
	lns, members := listeners(t, 2)
	_ = lns[1].Close()
	_, err := New(context.Background(), members, 0, WithListener(lns[0]), WithTLS(&tls.Config{}))
	require.ErrorContains(t, err, "the configuration presents no certificate")
}

// A member refuses a server at a peer's address whose certificate, signed
// by the job's CA, names another task: the group dials each member with
// its name as the configuration's ServerName, which mtls checks.
func TestTLSDialledMemberMustPresentItsCertificate(t *testing.T) {
	noLeaks(t)
	ca := newAuthority(t)
	cfgs := jobConfigs(t, ca, 3)
	lns, members := listeners(t, 2)
	impostor := make(chan struct{})
	go func() { // worker 2's certificate at worker 0's address
		defer close(impostor)
		nc, err := lns[0].Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		_ = tls.Server(nc, cfgs[2]).Handshake()
	}()
	defer func() { _ = lns[0].Close(); <-impostor }()
	core, logs := observer.New(zap.InfoLevel)
	_, err := New(context.Background(), members, 1, WithListener(lns[1]), WithTLS(cfgs[1]),
		WithStartupTimeout(2*time.Second), WithLogger(zap.New(core)))
	require.ErrorContains(t, err, "certificate names worker:2; the cluster has worker:0 at this address")
	refused := logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	require.NotEmpty(t, refused)
	m := refused[0].ContextMap()
	assert.Contains(t, m["reason"], "certificate names worker:2; the cluster has worker:0 at this address")
	assert.Equal(t, "worker:0", m["task_claimed"])
	assert.Contains(t, m["cert_identity"], "tfdist://"+testJob+"/worker/2")
}

// The bytes on the wire between two members, recorded by a proxy between
// them, hold a known gradient pattern in plaintext and not under TLS: the
// encryption is on the wire, not only configured.
func TestTLSEncryptsTheWire(t *testing.T) {
	noLeaks(t)
	marker := []byte("tfdist-gradient!")
	input := bytes.Repeat(marker, (2<<20)/len(marker))
	inputs := [][]byte{input, input}
	tcp := WithSharedMemory(false)
	for _, n := range []int{4 << 10, 2 << 20} { // the direct path and the ring
		plain := captureRun(t, nil, inputs, n, tcp)
		assert.True(t, bytes.Contains(plain, marker), "%d bytes: the plaintext capture holds the pattern", n)
		secure := captureRun(t, newAuthority(t), inputs, n, tcp)
		assert.Greater(t, len(secure), n, "the TLS capture holds the traffic")
		assert.False(t, bytes.Contains(secure, marker[:8]), "%d bytes: the TLS capture holds the pattern", n)
	}
}

// captureRun forms a 2-member group (TLS when ca is set) with opts whose
// one connection passes through a recording proxy, all-reduces the first n
// bytes of each input and returns the bytes the proxy saw.
func captureRun(t *testing.T, ca *mtls.Authority, inputs [][]byte, n int, opts ...Option) []byte {
	t.Helper()
	lns, members := listeners(t, 2)
	p := newProxy(t, lns[0].Addr().String())
	members[0].Addr = p.ln.Addr().String()
	var each func(int) []Option
	if ca != nil {
		each = withConfigs(jobConfigs(t, ca, 2))
	}
	gs, err := formGroups(lns, members, each, opts...)
	require.NoError(t, err)
	sumAll(t, gs, "grad", [][]byte{inputs[0][:n], inputs[1][:n]})
	closeAll(gs)
	return p.close()
}

// proxy forwards connections to a target and records every byte, both ways.
type proxy struct {
	ln  net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	rec bytes.Buffer
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.wg.Add(2)
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.rec.Write(buf[:n])
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			_ = dst.Close()
			_ = src.Close()
			return
		}
	}
}

// close stops the proxy and returns what it recorded.
func (p *proxy) close() []byte {
	_ = p.ln.Close()
	p.wg.Wait()
	return p.rec.Bytes()
}

// A group whose members disagree on TLS fails to form, and the error
// suggests why: the plaintext member's peer closed without answering, the
// TLS member's peer closed during the handshake.
func TestTLSMismatchIsExplained(t *testing.T) {
	noLeaks(t)
	cfgs := jobConfigs(t, newAuthority(t), 2)
	errs := formMixed(t, cfgs, []bool{true, false})
	require.Error(t, errs[1])
	assert.ErrorContains(t, errs[1], "does it require TLS, which this member does not use?")
	errs = formMixed(t, cfgs, []bool{false, true})
	require.Error(t, errs[1])
	assert.ErrorContains(t, errs[1], "does it run without TLS?")
}

// formMixed tries to form a group whose member i uses TLS when secure[i],
// and returns each member's New error.
func formMixed(t *testing.T, cfgs []*tls.Config, secure []bool) []error {
	lns, members := listeners(t, len(secure))
	errs := make([]error, len(secure))
	var wg sync.WaitGroup
	for i := range secure {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []Option{WithListener(lns[i]), WithStartupTimeout(time.Second), func(c *config) { c.helloTimeout = 500 * time.Millisecond }}
			if secure[i] {
				opts = append(opts, WithTLS(cfgs[i]))
			}
			g, err := New(context.Background(), members, i, opts...)
			if g != nil {
				_ = g.Close(context.Background())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errs
}
