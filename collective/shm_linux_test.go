//go:build linux

package collective

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/tfdist/tfdist/mtls"
)

// Members on one host move their frames to shared memory: the TCP
// connection between them, recorded by a proxy, carries the handshake
// only, with and without TLS, and the sums are right.
func TestSharedMemoryKeepsFramesOffTheWire(t *testing.T) {
	noLeaks(t)
	marker := []byte("tfdist-gradient!")
	input := bytes.Repeat(marker, (2<<20)/len(marker))
	for _, ca := range []bool{false, true} {
		for _, n := range []int{4 << 10, 2 << 20} {
			var authority *mtls.Authority
			if ca {
				authority = newAuthority(t)
			}
			capture := captureRun(t, authority, [][]byte{input, input}, n)
			assert.False(t, bytes.Contains(capture, marker[:8]), "TLS %v, %d bytes: the pattern went over TCP", ca, n)
			assert.Less(t, len(capture), 16<<10, "TLS %v, %d bytes: only the handshake goes over TCP", ca, n)
		}
	}
}

// The audit trail says which transport each peer joined on: shared memory
// between members that both use it, TCP with a member that does not, and
// the sums agree bit for bit either way.
func TestMixedTransports(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.InfoLevel)
	lns, members := listeners(t, 3)
	gs, err := formGroups(lns, members, func(i int) []Option {
		if i == 2 {
			return []Option{WithSharedMemory(false)}
		}
		return nil
	}, WithLogger(zap.New(core)))
	require.NoError(t, err)
	defer closeAll(gs)
	rng := rand.New(rand.NewPCG(3, 3))
	c := reduceCase{name: "mixed", dt: Float32, red: Sum}
	for range gs {
		c.ins = append(c.ins, randomBuffer(rng, Float32, 3<<18+7))
	}
	checkReduced(t, c, runConcurrently(t, gs, []reduceCase{c})[0])
	joined := logs.FilterMessage("peer joined").FilterLoggerName("audit").All()
	require.Len(t, joined, 6)
	for _, e := range joined {
		m := e.ContextMap()
		shm := m["member"] != "worker:2" && m["task"] != "worker:2"
		assert.Equal(t, shm, m["shared_memory"], "%v", m)
	}
}

// A local process that connects to a member's segment socket without the
// nonce of a pending offer is refused, and the group works on.
func TestSharedMemoryRefusesUnknownSegments(t *testing.T) {
	noLeaks(t)
	core, logs := observer.New(zap.WarnLevel)
	gs := newGroups(t, 2, WithLogger(zap.New(core)))
	addr := gs[0].shmLn.Addr().String()

	uc, err := net.Dial("unix", addr)
	require.NoError(t, err)
	_, err = uc.Write(bytes.Repeat([]byte{7}, shmNonceLen))
	require.NoError(t, err)
	waitForLog(t, logs, 1)
	_ = uc.Close()

	fds, mem, err := newSegment(64 << 10)
	require.NoError(t, err)
	uc, err = net.Dial("unix", addr)
	require.NoError(t, err)
	_, _, err = uc.(*net.UnixConn).WriteMsgUnix(bytes.Repeat([]byte{7}, shmNonceLen), unix.UnixRights(fds...), nil)
	require.NoError(t, err)
	closeFDs(fds)
	require.NoError(t, unmapSegment(mem))
	waitForLog(t, logs, 2)
	_ = uc.Close()

	refused := logs.FilterMessage("collective refused a shared-memory segment").All()
	require.Len(t, refused, 2)
	assert.Contains(t, refused[0].ContextMap()["error"], "0 descriptors, want 32 and 5")
	assert.Equal(t, "no offer has its nonce", refused[1].ContextMap()["error"])
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		return g.AllReduce(context.Background(), "still works", Sum, Float32, make([]byte, 1<<20))
	}))
}

func waitForLog(t *testing.T, logs *observer.ObservedLogs, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return logs.FilterMessage("collective refused a shared-memory segment").Len() >= n
	}, 30*time.Second, 5*time.Millisecond)
}

// shmPair returns both ends of a shared-memory connection with rings of
// ringBytes.
func shmPair(t *testing.T) (dialer, acceptor net.Conn) {
	t.Helper()
	ln, err := listenShm()
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	tcp := &net.TCPConn{}
	nonce := bytes.Repeat([]byte{1}, shmNonceLen)
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		uc, err := ln.AcceptUnix()
		if err != nil {
			accepted <- result{err: err}
			return
		}
		got, d, err := receiveShm(uc, time.Now().Add(5*time.Second))
		if err == nil && !bytes.Equal(got, nonce) {
			err = errors.New("nonce changed")
		}
		if err != nil {
			accepted <- result{err: err}
			return
		}
		c, err := d.open(tcp)
		accepted <- result{c, err}
	}()
	dialer, err = dialShm(ln.Addr().String(), nonce, time.Now().Add(5*time.Second), tcp)
	require.NoError(t, err)
	r := <-accepted
	require.NoError(t, r.err)
	t.Cleanup(func() { _ = dialer.Close(); _ = r.c.Close() })
	return dialer, r.c
}

// The connection carries bytes in order through many turns of its rings,
// with the writer waiting for the reader and the reader for the writer.
func TestShmConnCarriesAStream(t *testing.T) {
	noLeaks(t)
	a, b := shmPair(t)
	want := make([]byte, 3*shmRingBytes+12345)
	for i := range want {
		want[i] = byte(i * 7)
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < len(want); i += 100003 {
			if _, err := a.Write(want[i:min(i+100003, len(want))]); err != nil {
				done <- err
				return
			}
		}
		done <- a.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.True(t, bytes.Equal(want, got), "%d bytes read, want %d", len(got), len(want))
}

// Waits honour deadlines: a read with nothing to read, and a write into a
// full ring nobody reads.
func TestShmConnDeadlines(t *testing.T) {
	noLeaks(t)
	a, b := shmPair(t)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := b.Read(make([]byte, 8))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, a.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	n, err := a.Write(make([]byte, shmRingBytes+1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Equal(t, shmRingBytes, n)
}

// When one side closes without CloseWrite, as a killed process does, the
// other reads what was written, then EOF, and its writes fail.
func TestShmConnPeerGone(t *testing.T) {
	noLeaks(t)
	a, b := shmPair(t)
	_, err := a.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, a.Close())
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	assert.Equal(t, "last words", string(got))
	require.NoError(t, b.SetWriteDeadline(time.Now().Add(5*time.Second)))
	_, err = b.Write(make([]byte, 2*shmRingBytes))
	require.ErrorIs(t, err, errPeerGone)
	_, err = a.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)
}

// A peer that scribbles over the ring's shared counters makes this side's
// reads and writes fail with an error, never a panic or a read out of the
// ring.
func TestShmConnCorruptCounters(t *testing.T) {
	noLeaks(t)
	a, b := shmPair(t)
	_, err := a.Write([]byte("hello"))
	require.NoError(t, err)
	b.(*shmConn).in.head.Store(1 << 63) // what a's process would write
	_, err = b.Read(make([]byte, 8))
	require.ErrorIs(t, err, errRingCorrupt)
	a.(*shmConn).out.tail.Store(1 << 40)
	_, err = a.Write([]byte("more"))
	require.ErrorIs(t, err, errRingCorrupt)
}

// Over shared memory a data frame's payload lies at a multiple of
// payloadAlign in the reader's memory, whatever the lengths of the
// headers and payloads before it, so that the reader can reduce it where
// it lies; and it holds the bytes sent, across turns of the ring.
func TestSharedMemoryPayloadsLieAligned(t *testing.T) {
	noLeaks(t)
	a, b := shmPair(t)
	w, r := newPeerConn(a), newPeerConn(b)
	require.NotNil(t, r.viewer)
	rng := rand.New(rand.NewPCG(3, 3))
	payloads := make([][]byte, 200) // about twice the ring
	for i := range payloads {
		payloads[i] = make([]byte, 2*(1+rng.IntN(20000))) // float16s: any even length
		for j := range payloads[i] {
			payloads[i][j] = byte(rng.Uint32())
		}
	}
	name := func(i int) []byte { return bytes.Repeat([]byte{'n'}, 1+i%9) }
	done := make(chan error, 1)
	go func() {
		for i, p := range payloads {
			h := header{kind: kindData, op: opAllReduce, dtype: Float16, name: name(i), length: uint32(len(p))}
			if err := w.write(time.Now().Add(5*time.Second), appendHeader(nil, &h), p); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i, want := range payloads {
		h, err := r.readHeader()
		require.NoError(t, err)
		require.Equal(t, name(i), h.name)
		require.NoError(t, r.readPadding(h.length))
		p, err := r.viewer.view(int(h.length))
		require.NoError(t, err)
		require.Zero(t, uintptr(unsafe.Pointer(unsafe.SliceData(p)))%payloadAlign, "payload %d", i)
		require.True(t, bytes.Equal(want, p), "payload %d", i)
		r.viewer.consume(len(p))
	}
	require.NoError(t, <-done)
}

// crossMemoryWorks reports whether this environment lets a process read
// another's memory (process_vm_readv), which a seccomp policy may forbid.
func crossMemoryWorks(t *testing.T) bool {
	a, _ := shmPair(t)
	probeShm(a, true)
	return a.(*shmConn).canRead()
}

// Each side of a segment probes the other and publishes whether it can
// read the peer's memory, unless told not to; a lease vouches for exposed
// memory until it is revoked; a read of memory the peer does not have
// fails with an error.
func TestShmConnCrossMemory(t *testing.T) {
	noLeaks(t)
	if !crossMemoryWorks(t) {
		t.Skip("this environment forbids reading another process's memory")
	}
	da, db := shmPair(t)
	a, b := da.(*shmConn), db.(*shmConn)
	probeShm(a, true)
	probeShm(b, false)
	assert.True(t, a.canRead())
	assert.False(t, b.canRead())
	assert.False(t, a.peerReads(), "b declined")
	assert.True(t, b.peerReads())

	exposed := []byte("gradient chunk in b's memory")
	got := make([]byte, len(exposed))
	require.NoError(t, a.readRemote(got, uint64(uintptr(unsafe.Pointer(&exposed[0])))))
	assert.Equal(t, exposed, got)
	assert.Error(t, a.readRemote(got, 4096), "the first page is never mapped")

	slot, gen, ok := b.lease()
	require.True(t, ok)
	assert.True(t, a.leaseHeld(slot, gen))
	b.revoke(slot)
	assert.False(t, a.leaseHeld(slot, gen))
	again, gen2, ok := b.lease()
	require.True(t, ok)
	assert.Equal(t, slot, again, "a revoked slot is free again")
	assert.True(t, a.leaseHeld(slot, gen2))
	assert.False(t, a.leaseHeld(slot, gen), "an old generation stays revoked")
	assert.False(t, a.leaseHeld(shmLeases, gen2), "no such slot")
}
