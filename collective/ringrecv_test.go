package collective

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ringCall returns the receive side of a float32 sum of elems elements
// around a ring of n members, as member rank runs it, cut into chunks of
// chunkElems, without a network.
func ringCall(n, rank, elems, chunkElems int) *ringRecv {
	members := make([]Member, n)
	for i := range members {
		members[i] = Member{Name: fmt.Sprintf("worker:%d", i), Addr: "127.0.0.1:1"}
	}
	g := newGroup(defaultConfig(), members, rank)
	o := &op{g: g, name: "grad", self: header{kind: kindData, op: opAllReduce, dtype: Float32, red: Sum, count: uint64(elems)}}
	o.box = newMailbox(n)
	buf := make([]byte, 4*elems)
	return o.receiveRing(newRing(elems, n, chunkElems), buf, buf, nil)
}

// frameOf returns the header of chunk c of step k as the previous member
// sends it to rr's member.
func frameOf(rr *ringRecv, k, c int) header {
	h := rr.o.self
	lo, hi := rr.elems(k, c)
	w := rr.o.wireSize()
	h.step, h.chunk, h.offset, h.length = uint32(k), uint32(c), uint64(w*lo), uint32(w*(hi-lo))
	return h
}

// A compressed call's frames are applied where they lie but for the
// all-gather steps that forward the 16 bits they received.
func TestCompressedRingFramesInPlace(t *testing.T) {
	rr := ringCall(3, 1, 3*40, 40) // one chunk per segment
	rr.o.self.wire = Float16
	for k, want := range []bool{true, true, false, true} { // reduce-scatter, reduce-scatter, forwarding all-gather, last all-gather
		h := frameOf(rr, k, 0)
		inPlace, err := rr.admit(&h)
		require.NoError(t, err, "step %d", k)
		assert.Equal(t, want, inPlace, "step %d", k)
	}
}

// Frames are checked against the ring's schedule as they arrive: every
// chunk's steps in order, each at its place, whatever the order between
// chunks; anything else is a protocol violation naming the sender.
func TestRingFramesAreCheckedOnArrival(t *testing.T) {
	rr := ringCall(3, 1, 3*40+2, 10) // segments of 41, 41 and 40 elements: 5 chunks each
	require.Equal(t, 5, rr.r.chunks)
	steps := 2 * (3 - 1)
	for _, order := range [][2]int{{0, 0}, {0, 1}, {1, 0}, {0, 4}, {1, 1}, {2, 0}, {3, 0}} {
		h := frameOf(rr, order[0], order[1])
		inPlace, err := rr.admit(&h)
		require.NoError(t, err, "step %d chunk %d", order[0], order[1])
		assert.True(t, inPlace)
	}

	bad := map[string]func() header{
		"a step skipped":       func() header { return frameOf(rr, 3, 1) },
		"a step again":         func() header { return frameOf(rr, 0, 0) },
		"a chunk past the end": func() header { h := frameOf(rr, 0, 2); h.chunk = 5; return h },
		"a step past the end":  func() header { h := frameOf(rr, 3, 0); h.step = uint32(steps); return h },
		"the wrong place":      func() header { h := frameOf(rr, 0, 2); h.offset += 4; return h },
		"the wrong length":     func() header { h := frameOf(rr, 0, 2); h.length -= 4; return h },
	}
	for name, frame := range bad {
		h := frame()
		_, err := rr.admit(&h)
		require.ErrorIs(t, err, errProtocol, name)
		assert.Contains(t, err.Error(), "worker:0", name)
	}

	// A frame of another call is left to recv, which names the mismatch.
	h := frameOf(rr, 0, 2)
	h.red = Max
	inPlace, err := rr.admit(&h)
	require.NoError(t, err)
	assert.False(t, inPlace)
	assert.Equal(t, 0, rr.arrived[2], "a frame of another call does not advance the schedule")
}

// An all-gather frame is written into the region it covers only once this
// member's send from that region has returned, and not at all once the
// call is ending.
func TestRingAllGatherWaitsForTheSendFromItsRegion(t *testing.T) {
	rr := ringCall(2, 0, 8, 4) // one chunk per segment
	payload := []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}
	h := frameOf(rr, 1, 0) // the final values of segment 0, which step 0 sent from src

	applied := make(chan bool, 1)
	go func() { applied <- rr.apply(&frame{h: h}, payload) }()
	assert.Never(t, func() bool { return len(applied) > 0 }, 50*time.Millisecond, time.Millisecond,
		"applied before the send from the region returned")
	rr.sentChunk(0)
	require.True(t, <-applied)
	assert.Equal(t, payload, rr.dst[:16])

	h = frameOf(rr, 0, 0) // a reduce-scatter frame waits for nothing
	require.True(t, rr.apply(&frame{h: h}, make([]byte, 16)))

	rr = ringCall(3, 0, 12, 4)
	h = frameOf(rr, 3, 0) // overwrites what step 0 reduced and step 1 sent
	go func() { applied <- rr.apply(&frame{h: h}, make([]byte, 16)) }()
	rr.sentChunk(0) // step 0's send: not the one it waits for
	rr.ending.Store(true)
	assert.False(t, <-applied, "applied while the call was ending")
}

// A ring all-reduce cancelled while its peer's frames arrive (and are
// reduced where they lie in shared memory) leaves the caller's buffer
// alone once it has returned: nothing writes it afterwards (the race
// detector would see such a write against the reads below).
func TestCancelledRingLeavesTheBufferAlone(t *testing.T) {
	noLeaks(t)
	for _, delay := range []time.Duration{0, 200 * time.Microsecond, time.Millisecond, 5 * time.Millisecond} {
		gs := newGroups(t, 2, WithTimeout(300*time.Millisecond), func(c *config) { c.chunkBytes = 16 << 10 })
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(delay, cancel)
		bufs := [][]byte{make([]byte, 8<<20), make([]byte, 8<<20)}
		errs := onAll(gs, func(i int, g *Group) error {
			if i == 0 {
				return g.AllReduce(ctx, "x", Sum, Float32, bufs[0])
			}
			return g.AllReduce(context.Background(), "x", Sum, Float32, bufs[1])
		})
		if errs[0] == nil {
			continue // finished before the cancellation
		}
		require.ErrorIs(t, errs[0], context.Canceled, "delay %v", delay)
		before := bytes.Clone(bufs[0])
		time.Sleep(20 * time.Millisecond)
		require.True(t, bytes.Equal(before, bufs[0]), "delay %v: the buffer changed after the call returned", delay)
	}
}

// A chunk flagged as lying in the sender's memory, from a peer this member
// cannot read (over TCP, say), is a protocol error naming the peer.
func TestRemoteChunkFromAnUnreadablePeer(t *testing.T) {
	rr := ringCall(3, 1, 120, 10)
	h := frameOf(rr, 0, 0)
	h.flags, h.length = flagRemote, remoteRefLen
	_, err := rr.admit(&h)
	require.ErrorIs(t, err, errProtocol)
	assert.ErrorContains(t, err, "worker:0")
	assert.ErrorContains(t, err, "cannot")
}
