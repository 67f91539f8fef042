package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// noLeaks checks, once the test's groups are closed, that no goroutine is
// left.
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func TestMismatchFailsEveryMember(t *testing.T) {
	cases := []struct {
		name  string
		tune  func(*config)
		dt    func(rank int) DType
		bytes func(rank int) int
		has   string
	}{
		{"length direct", nil, func(int) DType { return Float32 },
			func(r int) int { return 4 * (1000 - r/2) }, "float32[999]"},
		{"length ring", smallChunks, func(int) DType { return Float32 },
			func(r int) int { return 4 * (1000 - r/2) }, "float32[999]"},
		{"dtype", nil, func(r int) DType { return [...]DType{Float32, Float32, Int32}[r] },
			func(int) int { return 400 }, "int32[100]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			gs := newGroups(t, 3, optional(c.tune)...)
			errs := onAll(gs, func(i int, g *Group) error {
				return g.AllReduce(context.Background(), "grads/pack_0", Sum, c.dt(i), make([]byte, c.bytes(i)))
			})
			for i, err := range errs {
				var me *MismatchError
				require.ErrorAs(t, err, &me, "member %d", i)
				assert.Contains(t, err.Error(), `all-reduce "grads/pack_0": worker:`, "member %d", i)
				assert.Contains(t, err.Error(), "worker:2 has "+c.has, "member %d", i)
				assert.ErrorAs(t, gs[i].Err(), &me, "member %d's group is broken", i)
				assert.ErrorAs(t, gs[i].Barrier(context.Background(), "after"), &me, "later ops fail at once")
			}
		})
	}
}

func optional(tune func(*config)) []Option {
	if tune == nil {
		return nil
	}
	return []Option{tune}
}

func TestMismatchMessageNamesBothMembers(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	errs := onAll(gs, func(i int, g *Group) error {
		return g.AllReduce(context.Background(), "grads/pack_0", Sum, Float32, make([]byte, 4*(1000-i)))
	})
	for _, err := range errs {
		assert.EqualError(t, err, `collective: all-reduce "grads/pack_0": worker:0 has float32[1000], worker:1 has float32[999]`)
	}
}

// Tensors of the same dtype and length but different shapes fail on every
// member, naming both shapes; an all-gather's first dimension may differ.
func TestShapeMismatch(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	shapes := [][]int64{{2, 3}, {3, 2}}
	errs := onAll(gs, func(i int, g *Group) error {
		if _, err := g.AllGather(context.Background(), "rows", Int32, make([]byte, 4*2*(i+1)), Shape(int64(i+1), 2)); err != nil {
			return err
		}
		return g.AllReduce(context.Background(), "w", Sum, Float32, make([]byte, 24), Shape(shapes[i]...))
	})
	for _, err := range errs {
		assert.EqualError(t, err, `collective: all-reduce "w": worker:0 has float32[2,3], worker:1 has float32[3,2]`)
	}
}

// A shape that does not describe the buffer is the caller's error, found
// before anything is sent.
func TestShapeMustDescribeTheBuffer(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	err := gs[0].AllReduce(context.Background(), "w", Sum, Float32, make([]byte, 24), Shape(2, 2))
	assert.EqualError(t, err, `collective: all-reduce "w": shape [2 2] has 4 elements, the buffer 6`)
	assert.NoError(t, gs[0].Err(), "the group still works")
}

func TestOperationKindMismatch(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	errs := onAll(gs, func(i int, g *Group) error {
		if i == 0 {
			return g.Broadcast(context.Background(), "x", 0, Int32, make([]byte, 8))
		}
		_, err := g.AllGather(context.Background(), "x", Int32, make([]byte, 8))
		return err
	})
	for _, err := range errs {
		var me *MismatchError
		require.ErrorAs(t, err, &me)
		assert.Equal(t, [2]string{"broadcast of int32[2]", "all-gather of int32[2]"}, me.Has)
	}
}

// crash closes every connection of g abruptly, like a killed process.
func crash(g *Group) {
	for _, c := range g.conns {
		if c == nil {
			continue
		}
		if tc, ok := c.nc.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.nc.Close()
	}
}

func TestMemberDyingFailsPendingOps(t *testing.T) {
	noLeaks(t)
	const timeout = 2 * time.Minute
	gs := newGroups(t, 3, WithTimeout(timeout))
	start := time.Now()
	errs := onAll(gs, func(i int, g *Group) error {
		if i == 2 {
			crash(g)
			return nil
		}
		return g.AllReduce(context.Background(), "x", Sum, Float32, make([]byte, 1<<20))
	})
	assert.Less(t, time.Since(start), timeout/2, "failed promptly, not at the %v timeout", timeout)
	for i, err := range errs[:2] {
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "member %d", i)
		assert.Contains(t, err.Error(), "worker:2", "member %d", i)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
	}
}

func TestHungMemberTimesOut(t *testing.T) {
	noLeaks(t)
	// Long enough for members 0 and 1 both to start the all-reduce on a
	// loaded machine, so that worker:2 is the only peer it waits for.
	const timeout = time.Second
	gs := newGroups(t, 3, WithTimeout(timeout))
	start := time.Now()
	errs := onAll(gs[:2], func(i int, g *Group) error {
		return g.AllReduce(context.Background(), "x", Sum, Float32, make([]byte, 64))
	})
	// worker:2 never starts it: without the timeout the all-reduce would
	// wait forever, so any bound far past the timeout tells them apart.
	assert.Less(t, time.Since(start), timeout+30*time.Second, "the all-reduce ends at its timeout")
	for i, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded, "member %d", i)
		var te *TimeoutError
		require.ErrorAs(t, err, &te, "member %d", i)
		assert.Equal(t, []Member{gs[2].members[2]}, te.Peers)
		assert.Contains(t, err.Error(), `all-reduce "x" timed out after 1s waiting for worker:2 (127.0.0.1:`)
	}
}

func TestTimeoutNamesOperationsPeersStarted(t *testing.T) {
	noLeaks(t)
	// Long enough for each member's barrier to reach the other on a loaded
	// machine before either times out.
	gs := newGroups(t, 2, WithTimeout(time.Second))
	errs := onAll(gs, func(i int, g *Group) error {
		return g.Barrier(context.Background(), fmt.Sprintf("step-%d", i))
	})
	for i, err := range errs { // the member that times out first aborts the other with its error
		assert.Regexp(t, `worker:. started "step-."#0, not started here`, err.Error(), "member %d", i)
	}
}

func TestCallerCancellationKeepsGroup(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := gs[0].AllReduce(ctx, "never-matched", Sum, Int32, make([]byte, 4))
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "worker:1")
	require.NoError(t, gs[0].Err())
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		return g.AllReduce(context.Background(), "next", Sum, Int32, make([]byte, 4))
	}))
}

func TestCloseIsOrderlyAndIdempotent(t *testing.T) {
	noLeaks(t)
	gs, err := tryGroups(t, 3)
	require.NoError(t, err)
	requireAllOK(t, onAll(gs, func(i int, g *Group) error { return g.Close(context.Background()) }))
	for _, g := range gs {
		require.NoError(t, g.Close(context.Background()))
		require.ErrorIs(t, g.Err(), ErrClosed)
		require.ErrorIs(t, g.Barrier(context.Background(), "b"), ErrClosed)
		require.ErrorIs(t, g.AllReduce(context.Background(), "x", Sum, Int32, nil), ErrClosed)
	}
}

// A member that closes with an operation of its own pending does not say
// it is closing (that operation may still need it); its peers' operations
// that wait for it fail once it has closed, as having finished.
func TestPendingOpFailsWhenPeerCloses(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2, WithTimeout(20*time.Second))
	done := make(chan error, 1)
	go func() { done <- gs[0].AllReduce(context.Background(), "x", Sum, Int32, make([]byte, 4)) }()
	own := make(chan error, 1)
	go func() { own <- gs[1].AllReduce(context.Background(), "y", Sum, Int32, make([]byte, 4)) }()
	require.Eventually(t, func() bool { return gs[1].Stats().AllReduces == 1 }, 30*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	closeErr := gs[1].Close(ctx) // its barrier never meets member 0
	require.ErrorIs(t, closeErr, context.DeadlineExceeded)
	require.ErrorIs(t, <-own, ErrClosed)
	err := <-done
	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "worker:1", pe.Peer.Name)
	assert.ErrorIs(t, err, ErrPeerLeft)
	assert.Contains(t, err.Error(), "worker:1 ("+pe.Peer.Addr+"): has finished")
}

// A member that closes its group while a peer waits for it in an
// operation it never starts fails that operation at once, as having
// finished, not at the timeout; the peer's abort then fails its barrier.
func TestWaitingOpFailsAtOnceWhenPeerStartsClosing(t *testing.T) {
	noLeaks(t)
	const timeout = 2 * time.Minute
	gs := newGroups(t, 3, WithTimeout(timeout))
	started := time.Now()
	errs := onAll(gs, func(i int, g *Group) error {
		if i == 2 {
			return g.Close(context.Background())
		}
		return g.AllReduce(context.Background(), "x", Sum, Int32, make([]byte, 4))
	})
	assert.Less(t, time.Since(started), timeout/2, "no one waits for the %v timeout", timeout)
	direct := 0
	for i := range 2 { // a survivor may learn it from the other one's abort
		require.ErrorContains(t, errs[i], "worker:2", "member %d", i)
		assert.ErrorContains(t, errs[i], "has finished and left the group: it is closing it", "member %d", i)
		var pe *PeerError
		if errors.Is(errs[i], ErrPeerLeft) && errors.As(errs[i], &pe) && pe.Peer.Name == "worker:2" {
			direct++
		}
	}
	assert.Positive(t, direct, "a survivor's own operation failed for want of worker:2")
	require.Error(t, errs[2], "the closing member's barrier fails: its peers broke the group")
}

// Members that close right after their last operation never fail it as
// if a peer had left: a peer's frames of an operation it completed arrive
// before it says it is closing.
func TestCloseRightAfterTheLastOperation(t *testing.T) {
	noLeaks(t)
	for range 50 {
		gs, err := tryGroups(t, 3)
		require.NoError(t, err)
		requireAllOK(t, onAll(gs, func(i int, g *Group) error {
			if err := g.AllReduce(context.Background(), "last", Sum, Float32, make([]byte, 4<<10)); err != nil {
				return err
			}
			return g.Close(context.Background())
		}))
	}
}

// Once Close has begun, new operations fail with ErrClosed, so that a
// member's peers never wait for one it started after saying it closes.
func TestNoOperationStartsOnceCloseBegins(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2, WithTimeout(20*time.Second))
	closed := make(chan error, 1)
	go func() { closed <- gs[1].Close(context.Background()) }()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel() // before Close begins, the call waits for member 0 until ctx ends
		return errors.Is(gs[1].AllReduce(ctx, "late", Sum, Int32, make([]byte, 4)), ErrClosed)
	}, 30*time.Second, time.Millisecond)
	require.NoError(t, gs[0].Close(context.Background()))
	require.NoError(t, <-closed)
}
