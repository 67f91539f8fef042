//go:build linux

package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/shmbridge"
)

// smallPushes has every all-reduce of 64 KiB or more push (push.go), in
// chunks of 8 KiB.
func smallPushes(c *config) { c.pushMin, c.chunkBytes = 64<<10, 8<<10 }

// Members whose results lie in each other's arenas write every segment
// they complete straight into their peers' results: the results are the
// same bits on every member and match the reference, for every type,
// reduction and uneven length, with 2, 3 and 5 members.
func TestPushedResultsMatchReference(t *testing.T) {
	noLeaks(t)
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			gs := newGroups(t, n, smallPushes)
			rng := rand.New(rand.NewPCG(uint64(n), 11))
			var cases []reduceCase
			for _, elems := range []int{(64 << 10) / 4, 3<<15 + 7} {
				for _, dt := range allDTypes {
					for _, red := range allReductions {
						c := reduceCase{name: fmt.Sprintf("%v/%v/%d", dt, red, elems), dt: dt, red: red}
						for range n {
							c.ins = append(c.ins, randomBuffer(rng, dt, elems))
						}
						if len(c.ins[0]) >= 64<<10 {
							cases = append(cases, c)
						}
					}
				}
			}
			var bufs []*sharedBuffer
			outs := runInto(t, gs, cases, func(m int, in []byte) ([]byte, []byte) {
				b := gs[m].outputBuffer(len(in))
				require.NotNil(t, b, "member %d has no arena buffer", m)
				bufs = append(bufs, b)
				return b.Bytes(), in
			})
			for i, c := range cases {
				checkReduced(t, c, outs[i])
			}
			for _, b := range bufs {
				b.Release()
			}
			for m, g := range gs {
				assert.Positive(t, g.pushed.Load(), "member %d pushed nothing", m)
			}
			assertSentLikeTheRing(t, gs, cases)
		})
	}
}

// A call pushes only when every member's result lies in its arena: one
// member with its result in its own memory makes every member take the
// ring's all-gather, and the results are right either way.
func TestOneResultOutsideTheArenaStopsPushes(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 3, smallPushes)
	rng := rand.New(rand.NewPCG(5, 5))
	c := reduceCase{name: "mixed", dt: Float32, red: Sum}
	for range gs {
		c.ins = append(c.ins, randomBuffer(rng, Float32, 1<<17+1))
	}
	outs := runInto(t, gs, []reduceCase{c}, func(m int, in []byte) ([]byte, []byte) {
		if m == 1 {
			return make([]byte, len(in)), in
		}
		b := gs[m].outputBuffer(len(in))
		require.NotNil(t, b)
		t.Cleanup(b.Release)
		return b.Bytes(), in
	})
	checkReduced(t, c, outs[0])
	for m, g := range gs {
		assert.Zero(t, g.pushed.Load(), "member %d pushed", m)
	}
}

// Groups over TCP, and buffers below the size that pushes, get no arena
// buffer: the caller uses its own memory.
func TestOutputBufferOnlyWherePeersMapIt(t *testing.T) {
	noLeaks(t)
	tcp := newGroups(t, 2, WithSharedMemory(false), smallPushes)
	assert.Nil(t, tcp[0].outputBuffer(1<<20))
	assert.True(t, shmbridge.OutputBuffer(tcp[0], 1<<20) == nil, "the kernels' bridge returns a nil Buffer")
	shm := newGroups(t, 2, smallPushes)
	assert.Nil(t, shm[0].outputBuffer(1<<10))
	b := shm[0].outputBuffer(1 << 20)
	require.NotNil(t, b)
	assert.Len(t, b.Bytes(), 1<<20)
	b.Release()
	bb := shmbridge.OutputBuffer(shm[0], 1<<20)
	require.NotNil(t, bb)
	assert.Len(t, bb.Bytes(), 1<<20)
	bb.Release()
}

// The arena reuses released spans, merges neighbours, and never reuses a
// span a failed call quarantined.
func TestArenaReusesReleasedSpans(t *testing.T) {
	a, err := newArena(1 << 20)
	require.NoError(t, err)
	x, y := a.alloc(256<<10), a.alloc(256<<10+1)
	require.NotNil(t, x)
	require.NotNil(t, y)
	assert.Equal(t, 0, x.off)
	assert.Equal(t, 256<<10, y.off)
	assert.Nil(t, a.alloc(768<<10), "only 512 KiB are left")
	x.Release()
	z := a.alloc(128 << 10)
	require.NotNil(t, z)
	assert.Equal(t, 0, z.off, "x's span is reused")
	z.Release()
	y.Release()
	whole := a.alloc(1 << 20)
	require.NotNil(t, whole, "the released spans merge back into one")
	a.quarantine(whole.off + 10)
	whole.Release()
	assert.Nil(t, a.alloc(4096), "a quarantined span stays out of use")
}

// A member that dies while its peers push fails them promptly, naming it,
// and their results' spans stay out of use: the dead member's pushes
// might still land there.
func TestDeathDuringPushesQuarantinesResults(t *testing.T) {
	noLeaks(t)
	var once sync.Once
	var gs []*Group
	const timeout = 2 * time.Minute
	gs = newGroups(t, 3, smallPushes, WithTimeout(timeout), func(c *config) {
		c.beforePush = func(step, chunk int) {
			if chunk == 3 {
				once.Do(func() { crash(gs[2]) })
			}
		}
	})
	bufs := make([]*sharedBuffer, 3)
	for m := range gs {
		bufs[m] = gs[m].outputBuffer(1 << 20)
		require.NotNil(t, bufs[m])
	}
	start := time.Now()
	errs := onAll(gs, func(i int, g *Group) error {
		return g.AllReduceTo(context.Background(), "x", Sum, Float32, bufs[i].Bytes(), make([]byte, 1<<20))
	})
	assert.Less(t, time.Since(start), timeout/2, "failed promptly, not at the %v timeout", timeout)
	a := gs[0].arena
	for i, err := range errs[:2] {
		require.Error(t, err, "member %d", i)
		assert.Contains(t, err.Error(), "worker:2", "member %d", i)
		bufs[i].Release()
		a.mu.Lock()
		a.reclaim()
		_, live := a.live[bufs[i].slot]
		kept := a.kept[bufs[i].slot]
		a.mu.Unlock()
		assert.False(t, live || kept, "member %d's slot is free again", i)
		b := a.alloc(1 << 20)
		require.NotNil(t, b)
		assert.NotEqual(t, bufs[i].off, b.off, "member %d's span is reused", i)
		t.Cleanup(b.Release)
	}
	bufs[2].Release()
}

// assertSentLikeTheRing checks that the members' BytesSent, summed, count
// what the ring would have sent without pushes: 2(n-1)/n of each case's
// bytes per member (the direct path's (n-1) times them, below the ring).
func assertSentLikeTheRing(t *testing.T, gs []*Group, cases []reduceCase) {
	t.Helper()
	n := len(gs)
	var want, got int64
	for _, c := range cases {
		b := int64(len(c.ins[0]))
		if b <= int64(gs[0].cfg.directMax) {
			want += int64(n) * int64(n-1) * b
		} else {
			want += 2 * int64(n-1) * b
		}
	}
	for _, g := range gs {
		got += g.Stats().BytesSent
	}
	assert.InDelta(t, want, got, float64(want)/100, "bytes sent by all members")
}

// A compressed all-reduce whose members push moves float32, as nothing
// crosses a wire: its results are exactly the uncompressed call's, and
// the bytes sent are float32's.
func TestCompressedPushesMoveFloat32(t *testing.T) {
	noLeaks(t)
	for _, n := range []int{2, 3} {
		gs := newGroups(t, n, smallPushes)
		rng := rand.New(rand.NewPCG(uint64(n), 21))
		var cases []reduceCase
		ins := make([][]byte, n)
		for m := range ins {
			ins[m] = randomBuffer(rng, Float32, 1<<17+5)
		}
		for _, wire := range []DType{0, Float16, BFloat16} {
			cases = append(cases, reduceCase{name: fmt.Sprintf("wire %v", wire), dt: Float32, red: Sum, wire: wire, ins: ins})
		}
		outs := runInto(t, gs, cases, func(m int, in []byte) ([]byte, []byte) {
			b := gs[m].outputBuffer(len(in))
			require.NotNil(t, b)
			t.Cleanup(b.Release)
			return b.Bytes(), in
		})
		for i := range cases {
			for m := range gs {
				require.Equal(t, outs[0][m], outs[i][m], "members=%d %s member %d: the float32 result", n, cases[i].name, m)
			}
		}
		cases[1].wire, cases[2].wire = 0, 0 // what was sent: float32
		assertSentLikeTheRing(t, gs, cases)
	}
}
