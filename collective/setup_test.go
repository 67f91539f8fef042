package collective

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestNewFailsNamingMissingMember(t *testing.T) {
	noLeaks(t)
	// Long enough for workers 0 and 1 to connect to each other on a loaded
	// machine, so that worker:2 is the only one missing.
	const startup = 2 * time.Second
	lns, members := listeners(t, 3)
	require.NoError(t, lns[2].Close()) // worker:2 never starts
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := New(context.Background(), members, i, WithListener(lns[i]), WithStartupTimeout(startup))
			if g != nil {
				_ = g.Close(context.Background())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	// worker:2 never starts: without the startup timeout New would wait for
	// it forever, so any bound far past the timeout tells them apart.
	assert.Less(t, time.Since(start), startup+30*time.Second, "New ends at its startup timeout")
	for i, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded, "member %d", i)
		assert.Contains(t, err.Error(), "could not connect to worker:2 ("+members[2].Addr+")", "member %d", i)
		assert.NotContains(t, err.Error(), "worker:1 (", "member %d", i)
	}
}

func TestNewRefusesDifferentFingerprint(t *testing.T) {
	noLeaks(t)
	members, errs := newPair(t, func(i int) Option { return WithFingerprint(uint64(0xaa + i)) })
	assert.EqualError(t, errs[0], "collective: worker:1 ("+members[1].Addr+") was started with a different cluster (fingerprint 0xab, this member has 0xaa)")
	assert.EqualError(t, errs[1], "collective: worker:0 ("+members[0].Addr+") was started with a different cluster (fingerprint 0xaa, this member has 0xab)")
}

func TestNewRefusesDifferentEpoch(t *testing.T) {
	noLeaks(t)
	_, errs := newPair(t, func(i int) Option { return WithEpoch(uint32(i)) })
	for _, err := range errs {
		assert.ErrorContains(t, err, "was started with membership epoch")
	}
}

// newPair starts a group of two whose member i also takes opt(i), closes
// whatever forms, and returns the members and each one's error from New.
func newPair(t *testing.T, opt func(i int) Option) ([]Member, []error) {
	lns, members := listeners(t, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := New(context.Background(), members, i, WithListener(lns[i]), opt(i), WithStartupTimeout(time.Minute))
			if g != nil {
				_ = g.Close(context.Background())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return members, errs
}

func TestForeignConnectionsAreRefused(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.WarnLevel)
	gs := newGroups(t, 2, WithLogger(zap.New(core)), func(c *config) { c.helloTimeout = 200 * time.Millisecond })
	addr := gs[0].members[0].Addr
	garbage := make([]byte, 100)
	_, _ = rand.Read(garbage)
	clients := map[string][]byte{
		"random bytes": garbage,
		"http":         []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"silent":       nil,
	}
	for name, payload := range clients {
		refused(t, name, "127.0.0.1", addr, payload)
	}
	refused(t, "other host", "127.0.0.2", addr, gs[1].hello(kindHello, ""))
	refusals := logs.FilterLoggerName("audit").FilterMessage("peer refused")
	for _, e := range refusals.All() {
		assert.Equal(t, zap.WarnLevel, e.Level)
		assert.Contains(t, e.ContextMap(), "address", e.Message)
	}
	assert.Equal(t, 3, refusals.FilterFieldKey("reason").Filter(func(e observer.LoggedEntry) bool {
		return strings.HasPrefix(e.ContextMap()["reason"].(string), "does not speak the protocol")
	}).Len())
	assert.Equal(t, 1, refusals.FilterField(zap.String("reason", "connection from a host that is not a member's")).Len())
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		return g.AllReduce(context.Background(), "still works", Sum, Float32, make([]byte, 1024))
	}))
}

// refused connects to addr from host, sends payload and waits until the
// group closes the connection.
func refused(t *testing.T, name, host, addr string, payload []byte) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err, name)
	defer func() { _ = c.Close() }()
	if payload != nil {
		_, err = c.Write(payload)
		require.NoError(t, err, name)
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadAll(c)
	if err != nil {
		require.NotErrorIs(t, err, context.DeadlineExceeded, name)
	}
}

func TestLateMemberHelloIsRefused(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.WarnLevel)
	gs := newGroups(t, 2, WithLogger(zap.New(core)))
	c, err := net.Dial("tcp", gs[0].members[0].Addr)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	_, err = c.Write(gs[1].hello(kindHello, ""))
	require.NoError(t, err)
	pc := newPeerConn(c)
	h, err := pc.readHeader()
	require.NoError(t, err)
	assert.Equal(t, kindReject, h.kind)
	assert.Equal(t, 1, logs.FilterMessage("peer refused").FilterLoggerName("audit").Len())
	requireAllOK(t, onAll(gs, func(i int, g *Group) error { return g.Barrier(context.Background(), "ok") }))
}
