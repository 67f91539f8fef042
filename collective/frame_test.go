package collective

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := header{kind: kindData, op: opBroadcast, dtype: BFloat16, red: Max, epoch: 3, seq: 1 << 40,
		count: 12345, offset: 678, root: 2, step: 5, chunk: 9, length: 4096, wire: Float16, name: []byte("grads/pack_0")}
	b := appendHeader(nil, &h)
	require.Len(t, b, fixedLen+len(h.name))
	got, n, err := decodeHeader(append(b, 0xff))
	require.NoError(t, err)
	assert.Equal(t, len(b), n)
	assert.Equal(t, h, got)
}

func TestDecodeHeaderRejectsForeignBytes(t *testing.T) {
	http := []byte("GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: x\r\nAccept: */*\r\n\r\n")
	_, _, err := decodeHeader(http)
	require.ErrorIs(t, err, errProtocol)
	assert.ErrorContains(t, err, "bad magic")
	h := appendHeader(nil, &header{kind: kindHello})
	h[4] = frameVersion + 1
	_, _, err = decodeHeader(h)
	assert.ErrorContains(t, err, fmt.Sprintf("version %d", frameVersion+1))
}

// Only the data frames of operations that move data may be flagged
// remote, only all-reduces' pushed or arena, one flag at a time, and no
// other flag exists.
func TestDecodeHeaderRejectsMisplacedFlags(t *testing.T) {
	ok := header{kind: kindData, op: opAllReduce, dtype: Float32, length: remoteRefLen, flags: flagRemote}
	_, _, err := decodeHeader(appendHeader(nil, &ok))
	require.NoError(t, err)
	for _, f := range []uint8{flagPushed, flagArena} {
		ok.flags, ok.length = f, 0
		_, _, err := decodeHeader(appendHeader(nil, &ok))
		require.NoError(t, err)
	}
	for _, h := range []header{
		{kind: kindData, op: opBarrier, dtype: Float32, flags: flagRemote},
		{kind: kindAbort, flags: flagRemote},
		{kind: kindData, op: opAllReduce, dtype: Float32, flags: 8},
		{kind: kindData, op: opAllReduce, dtype: Float32, flags: flagRemote | flagPushed},
		{kind: kindData, op: opAllGather, dtype: Float32, flags: flagPushed},
		{kind: kindData, op: opBroadcast, dtype: Float32, flags: flagArena},
		{kind: kindData, op: opReduceScatter, dtype: Float32, flags: flagPushed},
	} {
		_, _, err := decodeHeader(appendHeader(nil, &h))
		require.ErrorIs(t, err, errProtocol, "%+v", h)
		assert.ErrorContains(t, err, "flags")
	}
}

func TestAbortRoundTrip(t *testing.T) {
	me := &MismatchError{Op: "all-reduce", Name: "w", Members: [2]Member{{"worker:0", "a:1"}, {"worker:1", "b:2"}},
		Has: [2]string{"float32[2]", "float32[3]"}}
	got := decodeAbort(Member{Name: "worker:1", Addr: "b:2"}, encodeAbort(me))
	assert.Equal(t, me, got)
	got = decodeAbort(Member{Name: "worker:1", Addr: "b:2"}, encodeAbort(errors.New("boom")))
	assert.EqualError(t, got, "collective: worker:1 (b:2): aborted the group: boom")
	te := &TimeoutError{Op: "barrier", Name: "b", After: 1500 * time.Millisecond,
		Peers: []Member{{"worker:2", "c:3"}, {"worker:3", "d:4"}}, Detail: "x"}
	assert.Equal(t, te, decodeAbort(Member{}, encodeAbort(te)))
	var pe *PeerError
	assert.ErrorAs(t, decodeAbort(Member{}, []byte{abortMismatch, 5}), &pe)
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(appendHeader(nil, &header{kind: kindData, op: opAllReduce, dtype: Float32, red: Sum, count: 10, length: 40, name: []byte("x")}))
	f.Add(appendHeader(nil, &header{kind: kindData, op: opAllReduce, dtype: Float32, red: Mean, count: 10, length: 20, wire: BFloat16, name: []byte("g")}))
	f.Add(appendHeader(nil, &header{kind: kindData, op: opAllReduce, dtype: Float32, red: Sum, count: 1 << 20, offset: 1 << 20, step: 1, chunk: 3, length: remoteRefLen, flags: flagRemote, name: []byte("r")}))
	f.Add(appendHeader(nil, &header{kind: kindHello, seq: 0xfeed, root: 1, count: 2}))
	f.Add(appendHeader(nil, &header{kind: kindAbort, length: 7}))
	f.Add(appendHeader(nil, &header{kind: kindData, op: opAllGather, dtype: Int64, count: 6, name: []byte("rows"), dims: []uint64{3, 2}}))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := decodeHeader(b)
		if err != nil {
			return
		}
		if n > len(b) || n != fixedLen+len(h.name)+8*len(h.dims) {
			t.Fatalf("used %d of %d bytes with a name of %d and %d dimensions", n, len(b), len(h.name), len(h.dims))
		}
		again, m, err := decodeHeader(appendHeader(nil, &h))
		if err != nil || m != n {
			t.Fatalf("re-encoding failed: %v (%d bytes, want %d)", err, m, n)
		}
		assert.Equal(t, h, again)
		_ = decodeAbort(Member{}, b)
	})
}
