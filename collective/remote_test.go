//go:build linux

package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A member reads a peer's memory only when it agreed to: with one member
// that does not, its links carry bytes both ways, the others' read each
// other, and the sums agree bit for bit either way. The audit trail says
// which member reads its peers.
func TestRemoteChunksNeedTheReadersConsent(t *testing.T) {
	noLeaks(t)
	if !crossMemoryWorks(t) {
		t.Skip("this environment forbids reading another process's memory")
	}
	core, logs := observer.New(zap.InfoLevel)
	lns, members := listeners(t, 3)
	gs, err := formGroups(lns, members, func(i int) []Option {
		if i == 2 {
			return []Option{func(c *config) { c.remoteMin = 0 }}
		}
		return []Option{everyChunkRemote}
	}, WithLogger(zap.New(core)), func(c *config) { c.chunkBytes = 4 << 10 })
	require.NoError(t, err)
	defer closeAll(gs)
	rng := rand.New(rand.NewPCG(5, 5))
	var cases []reduceCase
	for _, red := range []Reduction{Sum, Mean, Max} {
		c := reduceCase{name: fmt.Sprint(red), dt: Float32, red: red}
		for range gs {
			c.ins = append(c.ins, randomBuffer(rng, Float32, 3<<15+5))
		}
		cases = append(cases, c)
	}
	outs := runConcurrently(t, gs, cases)
	for i, c := range cases {
		checkReduced(t, c, outs[i])
	}
	// Ring order 0 → 1 → 2 → 0: only 1 reads (from 0); 2 declined, so 1
	// sends it bytes, and 2 sends 0 bytes.
	assert.Zero(t, gs[0].remoteReads.Load())
	assert.Positive(t, gs[1].remoteReads.Load())
	assert.Zero(t, gs[2].remoteReads.Load())
	for _, e := range logs.FilterMessage("peer joined").FilterLoggerName("audit").All() {
		m := e.ContextMap()
		assert.Equal(t, m["member"] != "worker:2", m["reads_peer_memory"], "%v", m)
	}
}

// A member whose call ends early (its context is cancelled while it waits
// for the next member to finish reading its buffer, which it overwrites as
// soon as the call returns) never leaves that member with bytes it may
// have reused: the read fails instead of summing them. Worker 1 reads
// worker 0's last chunk only after worker 0's call has returned; worker 2
// has finished, so nothing else stops worker 1's call.
func TestEndedCallLeavesNoPeerWithStaleChunks(t *testing.T) {
	noLeaks(t)
	if !crossMemoryWorks(t) {
		t.Skip("this environment forbids reading another process's memory")
	}
	const n, elems, chunk = 3, 1 << 17, 16 << 10 // past the direct path
	last := newRing(elems, n, chunk/4).chunks - 1
	paused, gate := make(chan struct{}), make(chan struct{})
	lns, members := listeners(t, n)
	gs, err := formGroups(lns, members, func(i int) []Option {
		if i != 1 {
			return nil
		}
		return []Option{func(c *config) {
			c.beforeRemote = func(step, chunk int) {
				if step == 2*(n-1)-1 && chunk == last {
					close(paused)
					<-gate
				}
			}
		}}
	}, everyChunkRemote, WithTimeout(300*time.Millisecond), func(c *config) { c.chunkBytes = chunk })
	require.NoError(t, err)
	defer closeAll(gs)
	bufs := make([][]byte, n)
	errs := make([]chan error, n)
	for i := range gs {
		bufs[i], errs[i] = make([]byte, 4*elems), make(chan error, 1)
	}
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	defer open()
	ctx, cancel := context.WithCancel(context.Background())
	for _, i := range []int{1, 2} {
		go func() { errs[i] <- gs[i].AllReduce(context.Background(), "g", Sum, Float32, bufs[i]) }()
	}
	go func() {
		<-paused
		// Worker 0 has sent worker 2 its end of reads; worker 2 finishes.
		assert.NoError(t, <-errs[2])
		cancel()
	}()
	require.ErrorIs(t, gs[0].AllReduce(ctx, "g", Sum, Float32, bufs[0]), context.Canceled)
	for i := range bufs[0] {
		bufs[0][i] = 0xff // a NaN in every element
	}
	open()
	err = <-errs[1]
	require.Error(t, err, "worker 1 summed a buffer its owner had reused")
	assert.Contains(t, err.Error(), "worker:0")
}

// A buffer that only the call holds, as one the caller builds in the
// call's arguments, stays whole while peers read it by address: the
// collections and allocations before every read, which would free its
// memory and write over it were the call not holding it, leave every
// member exactly the bytes each member sent.
func TestRemoteChunksOfABufferOnlyTheCallHolds(t *testing.T) {
	if !crossMemoryWorks(t) {
		t.Skip("this environment forbids reading another process's memory")
	}
	const n, size = 3, 1 << 20
	gs := newGroups(t, n, everyChunkRemote, func(c *config) {
		c.beforeRemote = func(int, int) {
			runtime.GC()
			for range 4 {
				b := make([]byte, size)
				for i := range b {
					b[i] = 0xff
				}
			}
		}
	})
	sent := func(m int) []byte { return bytes.Repeat([]byte{byte(m + 1)}, size) }
	for it := range 3 {
		var mu sync.Mutex
		got := make([][][]byte, n)
		requireAllOK(t, onAll(gs, func(m int, g *Group) error {
			parts, err := g.AllGather(context.Background(), fmt.Sprint("x", it), Int8, sent(m))
			mu.Lock()
			got[m] = parts
			mu.Unlock()
			return err
		}))
		for m := range n {
			for p := range n {
				require.True(t, bytes.Equal(sent(p), got[m][p]), "iteration %d: member %d's copy of member %d's bytes", it, m, p)
			}
		}
	}
	assert.Positive(t, gs[0].remoteReads.Load())
}
