package elastic_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/syncbuf"
)

// serve runs a rendezvous for the test.
func serve(t *testing.T, opts ...elastic.Option) *elastic.Server {
	srv, err := elastic.Listen("127.0.0.1:0", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

func join(t *testing.T, srv *elastic.Server, name string) *elastic.Member {
	m, err := elastic.Join(context.Background(), srv.Addr(), elastic.Hello{Job: "j", Name: name, Fingerprint: 7})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// next asks for a membership in the background.
func next(m *elastic.Member, step int64) chan elastic.Membership {
	c := make(chan elastic.Membership, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		mb, err := m.Next(ctx, elastic.Report{Step: step, Addr: "127.0.0.1:1"})
		if err == nil {
			c <- mb
		}
		close(c)
	}()
	return c
}

func names(mb elastic.Membership) []string {
	var s []string
	for _, m := range mb.Members {
		s = append(s, m.Name)
	}
	return s
}

func TestFirstMembershipSettlesOrFills(t *testing.T) {
	srv := serve(t, elastic.WithMembers(2, 3), elastic.WithSettle(300*time.Millisecond))
	start := time.Now()
	a, b := next(join(t, srv, "a"), 0), next(join(t, srv, "b"), 0)
	mb := <-a
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "formed before the settle time with fewer than the maximum")
	assert.Equal(t, []string{"a", "b"}, names(mb))
	assert.Equal(t, uint32(1), mb.Epoch)
	assert.Equal(t, 1, (<-b).Rank)

	full := serve(t, elastic.WithMembers(2, 3), elastic.WithSettle(time.Hour))
	cs := []chan elastic.Membership{next(join(t, full, "a"), 0), next(join(t, full, "b"), 0), next(join(t, full, "c"), 0)}
	for i, c := range cs {
		mb, ok := <-c
		require.True(t, ok)
		assert.Equal(t, i, mb.Rank)
		assert.Len(t, mb.Members, 3)
	}
}

// TestRefusesForeignWorkers: a worker of another job, protocol or model,
// or a second worker of a member's name, is refused with the reason, and
// the members are not disturbed.
func TestRefusesForeignWorkers(t *testing.T) {
	srv := serve(t, elastic.WithJob("j"), elastic.WithMembers(1, 4), elastic.WithSettle(0), elastic.WithHeartbeatTimeout(1500*time.Millisecond))
	a := join(t, srv, "a")
	mb := <-next(a, 0)
	require.Equal(t, uint32(1), mb.Epoch)
	ctx := context.Background()
	for _, c := range []struct {
		hello elastic.Hello
		want  string
	}{
		{elastic.Hello{Job: "other", Name: "x", Fingerprint: 7}, `it belongs to job "other"; this is job "j"`},
		{elastic.Hello{Job: "j", Name: "x", Fingerprint: 8}, "fingerprint is 0000000000000008 and the job's 0000000000000007"},
		{elastic.Hello{Job: "j", Name: "a", Fingerprint: 7}, "a worker named a is already in the job"},
		{elastic.Hello{Job: "j", Fingerprint: 7}, "it gave no name"},
	} {
		_, err := elastic.Join(ctx, srv.Addr(), c.hello)
		var refused *elastic.RefusedError
		require.True(t, errors.As(err, &refused), "%+v: %v", c.hello, err)
		assert.Contains(t, refused.Reason, c.want)
	}
	assert.Contains(t, rawHello(t, srv.Addr(), 0), fmt.Sprintf("it speaks rendezvous protocol 0; this job speaks %d", elastic.ProtocolVersion))
	assert.False(t, a.Pending(), "a refused worker disturbed the members")
}

// rawHello says hello with protocol version v and returns the answer.
func rawHello(t *testing.T, addr string, v int) string {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	b, _ := json.Marshal(map[string]any{"kind": "hello", "hello": map[string]any{"protocol": v, "job": "j", "name": "old"}})
	require.NoError(t, binary.Write(c, binary.BigEndian, uint32(len(b))))
	_, err = c.Write(b)
	require.NoError(t, err)
	var n uint32
	require.NoError(t, binary.Read(c, binary.BigEndian, &n))
	answer := make([]byte, n)
	_, err = c.Read(answer)
	require.NoError(t, err)
	return string(answer)
}

// TestFlappingWorkerIsExcluded: a worker that keeps dying is admitted
// again up to the flap limit, then refused, and the job goes on.
func TestFlappingWorkerIsExcluded(t *testing.T) {
	srv := serve(t, elastic.WithMembers(1, 2), elastic.WithSettle(0), elastic.WithFlapLimit(2, time.Minute))
	a := join(t, srv, "a")
	<-next(a, 0)
	for i := range 3 {
		b := join(t, srv, "b")
		nb := next(b, 0)
		require.Eventually(t, a.Pending, 5*time.Second, time.Millisecond, "a joiner waits")
		na := next(a, int64(i))
		mb := <-nb
		require.Len(t, mb.Members, 2, "round %d", i)
		<-na
		_ = b.Close() // dies
		require.Eventually(t, a.Pending, 5*time.Second, time.Millisecond)
		mb = <-next(a, int64(i))
		require.Equal(t, []string{"a"}, names(mb))
		require.Len(t, mb.Left, 1)
		assert.Equal(t, "b", mb.Left[0].Name)
	}
	_, err := elastic.Join(context.Background(), srv.Addr(), elastic.Hello{Job: "j", Name: "b", Fingerprint: 7})
	var refused *elastic.RefusedError
	require.True(t, errors.As(err, &refused), "%v", err)
	assert.Contains(t, refused.Reason, "b left 3 times in the last 1m0s (the limit is 2): it is excluded")
}

// TestSilentMembersAreDropped: a member whose host went silent is dropped
// after the heartbeat timeout, and one alive but not reporting after the
// round timeout; the others go on without them.
func TestSilentMembersAreDropped(t *testing.T) {
	srv := serve(t, elastic.WithMembers(1, 3), elastic.WithSettle(time.Hour),
		elastic.WithHeartbeatTimeout(1500*time.Millisecond), elastic.WithRoundTimeout(500*time.Millisecond))
	a, b := join(t, srv, "a"), join(t, srv, "b")
	silent := silentMember(t, srv.Addr(), "c")
	na, nb := next(a, 0), next(b, 0)
	mb := <-na
	<-nb
	require.Len(t, mb.Members, 3)
	defer silent.Close()

	start := time.Now()
	select {
	case d := <-a.Lost():
		assert.Equal(t, "c", d.Name)
		assert.Equal(t, uint32(1), d.Epoch, "the membership it left")
	case <-time.After(5 * time.Second):
		t.Fatal("the members were not told that the silent member is gone")
	}
	require.Eventually(t, a.Pending, 5*time.Second, time.Millisecond, "the silent member was not dropped")
	mb = <-next(a, 1) // b never reports
	assert.Equal(t, []string{"a"}, names(mb))
	assert.GreaterOrEqual(t, time.Since(start), 1500*time.Millisecond)
	require.Len(t, mb.Left, 2)
	assert.Equal(t, "c", mb.Left[0].Name)
	assert.Equal(t, "no heartbeat for 1.5s", mb.Left[0].Why)
	assert.Equal(t, "b", mb.Left[1].Name)
	assert.Equal(t, "it did not report within the round timeout, 500ms", mb.Left[1].Why)
	assert.Equal(t, int64(1), mb.Step)
}

// silentMember joins as name, reports once, and then says nothing.
func silentMember(t *testing.T, addr, name string) net.Conn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	for _, m := range []map[string]any{
		{"kind": "hello", "hello": map[string]any{"protocol": elastic.ProtocolVersion, "job": "j", "name": name, "fingerprint": 7}},
		{"kind": "ready", "report": map[string]any{"step": 0, "addr": "127.0.0.1:1"}},
	} {
		b, _ := json.Marshal(m)
		require.NoError(t, binary.Write(c, binary.BigEndian, uint32(len(b))))
		_, err = c.Write(b)
		require.NoError(t, err)
	}
	return c
}

// TestSizes: with WithSizes(1, 2, 4), three workers make a membership of
// two and a standby, and a fourth makes one of four.
func TestSizes(t *testing.T) {
	srv := serve(t, elastic.WithMembers(1, 4), elastic.WithSizes(1, 2, 4), elastic.WithSettle(200*time.Millisecond))
	a, b, c := join(t, srv, "a"), join(t, srv, "b"), join(t, srv, "c")
	na, nb, nc := next(a, 0), next(b, 0), next(c, 0)
	mb := <-na
	assert.Equal(t, []string{"a", "b"}, names(mb))
	<-nb
	select {
	case <-nc:
		t.Fatal("the third worker got a membership of two")
	case <-time.After(100 * time.Millisecond):
	}
	d := join(t, srv, "d")
	nd := next(d, 0)
	require.Eventually(t, a.Pending, 5*time.Second, time.Millisecond, "four workers make a larger membership")
	na, nb = next(a, 5), next(b, 5)
	for _, ch := range []chan elastic.Membership{na, nb, nc, nd} {
		mb := <-ch
		assert.Equal(t, []string{"a", "b", "c", "d"}, names(mb))
		assert.Equal(t, int64(5), mb.Step)
	}
}

// TestFinishedJobReleasesStandbys: once a member leaves done, a standby
// waiting for a membership, and a worker joining late, learn that the
// job has finished.
func TestFinishedJobReleasesStandbys(t *testing.T) {
	srv := serve(t, elastic.WithMembers(2, 4), elastic.WithSizes(2, 4), elastic.WithSettle(0))
	a, b := join(t, srv, "a"), join(t, srv, "b")
	na, nb := next(a, 0), next(b, 0)
	<-na
	<-nb
	c := join(t, srv, "c")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Next(context.Background(), elastic.Report{Step: 0, Addr: "127.0.0.1:1"})
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond) // c waits: three make no membership larger than two
	require.NoError(t, a.Leave(true))
	require.ErrorIs(t, <-errc, elastic.ErrJobFinished)
	_, err := elastic.Join(context.Background(), srv.Addr(), elastic.Hello{Job: "j", Name: "late", Fingerprint: 7})
	require.ErrorIs(t, err, elastic.ErrJobFinished)
}

// TestFinishedJobReleasesMembersThatReport: a member that reports for a
// new membership (its last step failed) once another has finished, or
// before, learns that the job has finished rather than wait forever.
func TestFinishedJobReleasesMembersThatReport(t *testing.T) {
	for _, reportFirst := range []bool{true, false} {
		srv := serve(t, elastic.WithMembers(3, 3))
		a, b, c := join(t, srv, "a"), join(t, srv, "b"), join(t, srv, "c")
		na, nb, nc := next(a, 0), next(b, 0), next(c, 0)
		<-na
		<-nb
		<-nc
		errc := make(chan error, 1)
		report := func() {
			_, err := b.Next(context.Background(), elastic.Report{Step: 9, Addr: "127.0.0.1:1"})
			errc <- err
		}
		if reportFirst {
			go report()
			require.Eventually(t, a.Pending, 5*time.Second, time.Millisecond)
		}
		require.NoError(t, a.Leave(true))
		if !reportFirst {
			time.Sleep(50 * time.Millisecond)
			go report()
		}
		require.ErrorIs(t, <-errc, elastic.ErrJobFinished, "reported first: %v", reportFirst)
	}
}

func TestBadOptions(t *testing.T) {
	for _, c := range []struct {
		opt  elastic.Option
		want string
	}{
		{elastic.WithMembers(3, 2), "WithMembers(3, 2): expected 1 ≤ min ≤ max"},
		{elastic.WithMembers(0, 2), "WithMembers(0, 2)"},
		{elastic.WithHeartbeatTimeout(time.Second), "WithHeartbeatTimeout(1s): expected more than the heartbeat, 1s"},
		{elastic.WithRoundTimeout(0), "WithRoundTimeout(0s)"},
		{elastic.WithWaitTimeout(-1), "WithWaitTimeout(-1ns)"},
		{elastic.WithFlapLimit(-1, time.Minute), "WithFlapLimit(-1, 1m0s)"},
		{elastic.WithSizes(1, 2), "WithSizes([1 2]): expected ascending sizes between the minimum 1 and the maximum 1"},
		{elastic.WithReplay([]elastic.LogEntry{}), "WithReplay: no membership to replay"},
		{elastic.WithReplay([]elastic.LogEntry{{Step: 3, Members: []string{"a"}}}), "the first entry starts at step 3, expected 0"},
		{elastic.WithReplay([]elastic.LogEntry{{Members: []string{"a"}}, {Epoch: 2, Step: 9, Members: []string{"a"}}, {Epoch: 3, Step: 4, Members: []string{"a"}}}),
			"entry 2 (epoch 3) starts at step 4, before the step 9 of the entry before it"},
		{elastic.WithReplay([]elastic.LogEntry{{Epoch: 1}}), "entry 0 (epoch 1) has no members"},
	} {
		_, err := elastic.Listen("127.0.0.1:0", c.opt)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.want)
	}
}

// TestReplay: under WithReplay the rendezvous forms the logged
// memberships, in their order, each ending at the next one's step
// (Until), a worker outside one waiting as a standby; entries that
// trained no step are skipped, and its own log is the schedule.
func TestReplay(t *testing.T) {
	var log syncbuf.Buffer
	srv := serve(t, elastic.WithReplay([]elastic.LogEntry{
		{Epoch: 1, Step: 0, Members: []string{"a", "b"}},
		{Epoch: 2, Step: 5, Members: []string{"a"}}, // broke before a step
		{Epoch: 3, Step: 5, Members: []string{"b"}},
		{Epoch: 4, Step: 8, Members: []string{"b", "a"}},
	}), elastic.WithLog(&log))
	a, b := join(t, srv, "a"), join(t, srv, "b")
	na, nb := next(a, 0), next(b, 0)
	for _, ch := range []chan elastic.Membership{na, nb} {
		mb := <-ch
		assert.Equal(t, []string{"a", "b"}, names(mb))
		assert.Equal(t, int64(5), mb.Until)
	}
	na, nb = next(a, 5), next(b, 5)
	mb := <-nb
	assert.Equal(t, []string{"b"}, names(mb))
	assert.Equal(t, int64(8), mb.Until)
	nb = next(b, 8)
	for _, ch := range []chan elastic.Membership{na, nb} {
		mb := <-ch
		assert.Equal(t, []string{"b", "a"}, names(mb))
		assert.Equal(t, int64(8), mb.Step)
		assert.Zero(t, mb.Until, "the last membership trains to the end")
	}
	formed, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	var got []string
	for _, e := range formed {
		got = append(got, fmt.Sprint(e.Epoch, e.Step, e.Members))
	}
	assert.Equal(t, []string{"1 0 [a b]", "2 5 [b]", "3 8 [b a]"}, got)
}

// A replay whose next membership names a worker that never comes stops
// at the wait timeout, naming it.
func TestReplayStopsWithoutItsWorkers(t *testing.T) {
	srv := serve(t, elastic.WithReplay([]elastic.LogEntry{{Members: []string{"a", "c"}}}), elastic.WithWaitTimeout(300*time.Millisecond))
	a := join(t, srv, "a")
	_, err := a.Next(context.Background(), elastic.Report{Step: 0, Addr: "127.0.0.1:1"})
	var stop *elastic.StopError
	require.ErrorAs(t, err, &stop)
	assert.Contains(t, err.Error(), "the replay stopped: its membership 1 of 1 needs [a c], and [c] did not report within 300ms")
}

// ReadLog reads what WithLog writes, and names the line it cannot read.
func TestReadLogErrors(t *testing.T) {
	_, err := elastic.ReadLog(strings.NewReader(""))
	assert.ErrorContains(t, err, "membership log: no membership")
	_, err = elastic.ReadLog(strings.NewReader(`{"epoch": 1, "members": ["a"]}` + "\nnot json\n"))
	assert.ErrorContains(t, err, "membership log line 2")
}
