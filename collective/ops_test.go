package collective

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallChunks makes the ring carry many chunks on small buffers and sends
// every buffer over 64 bytes around the ring.
func smallChunks(c *config) {
	c.chunkBytes = 512
	c.directMax = 64
}

// lengthsFor returns element counts covering empty, single, uneven
// segments and many chunks per segment.
func lengthsFor(n int) []int {
	return []int{0, 1, n + 1, 2*n + 3, 1001, 5003}
}

type reduceCase struct {
	name string
	dt   DType
	red  Reduction
	wire DType    // Compress's wire type; 0 for none
	ins  [][]byte // per member
}

// opts returns the call options of the case.
func (c reduceCase) opts() []CallOption {
	if c.wire == 0 {
		return nil
	}
	return []CallOption{Compress(c.wire)}
}

// testTransports are the benchmarks' transports and shared memory with
// every chunk read from the sender's memory (remote.go).
var testTransports = append(transports[:len(transports):len(transports)],
	struct {
		name string
		opts []Option
	}{"shm-remote", []Option{everyChunkRemote}})

func everyChunkRemote(c *config) { c.remoteMin = 1 }

// overTestTransports runs test on groups of n members with small chunks
// over each of testTransports, and checks that over shm-remote the members
// did read each other's memory.
func overTestTransports(t *testing.T, n int, test func(*testing.T, []*Group)) {
	for _, tr := range testTransports {
		t.Run(fmt.Sprintf("transport=%s/members=%d", tr.name, n), func(t *testing.T) {
			gs := newGroups(t, n, append(tr.opts, smallChunks)...)
			test(t, gs)
			if tr.name == "shm-remote" && n > 1 && crossMemoryWorks(t) {
				assert.Positive(t, remoteReads(gs), "no chunk was read from a peer's memory")
			}
		})
	}
}

func TestAllReduceMatchesReference(t *testing.T) {
	for n := 1; n <= 5; n++ {
		overTestTransports(t, n, testAllReduceMatchesReference)
	}
}

// remoteReads counts the chunks gs's members read from a peer's memory.
func remoteReads(gs []*Group) (n int64) {
	for _, g := range gs {
		n += g.remoteReads.Load()
	}
	return n
}

func testAllReduceMatchesReference(t *testing.T, gs []*Group) {
	n := len(gs)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	var cases []reduceCase
	for _, elems := range lengthsFor(n) {
		for _, dt := range allDTypes {
			for _, red := range allReductions {
				c := reduceCase{name: fmt.Sprintf("%v/%v/%d", dt, red, elems), dt: dt, red: red}
				for range n {
					c.ins = append(c.ins, randomBuffer(rng, dt, elems))
				}
				cases = append(cases, c)
			}
		}
	}
	outs := runConcurrently(t, gs, cases)
	for i, c := range cases {
		checkReduced(t, c, outs[i])
	}
}

// runConcurrently issues every case on every member at once, each member
// in its own random order, reducing a copy of its input in place, and
// returns the outputs per case and member.
func runConcurrently(t *testing.T, gs []*Group, cases []reduceCase) [][][]byte {
	return runInto(t, gs, cases, func(m int, in []byte) (dst, src []byte) {
		out := append([]byte(nil), in...)
		return out, out
	})
}

// runInto is runConcurrently with each member's all-reduce from src into
// dst, which prepare returns for member m's input of a case.
func runInto(t *testing.T, gs []*Group, cases []reduceCase, prepare func(m int, in []byte) (dst, src []byte)) [][][]byte {
	t.Helper()
	type buffers struct{ dst, src []byte }
	prepared := make([][]buffers, len(gs)) // prepare runs here, one call at a time
	for m := range gs {
		for _, c := range cases {
			dst, src := prepare(m, c.ins[m])
			prepared[m] = append(prepared[m], buffers{dst, src})
		}
	}
	return runEach(t, gs, cases, func(g *Group, m, i int) ([]byte, error) {
		c, b := cases[i], prepared[m][i]
		return b.dst, g.AllReduceTo(context.Background(), c.name, c.red, c.dt, b.dst, b.src, c.opts()...)
	})
}

// runEach runs call for every case i on every member m at once, each
// member's cases in its own random order, and returns what call returned,
// by case and member.
func runEach(t *testing.T, gs []*Group, cases []reduceCase, call func(g *Group, m, i int) ([]byte, error)) [][][]byte {
	t.Helper()
	outs := make([][][]byte, len(cases))
	for i := range cases {
		outs[i] = make([][]byte, len(gs))
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(cases)*len(gs))
	for m, g := range gs {
		for _, i := range rand.New(rand.NewPCG(uint64(m), 1)).Perm(len(cases)) {
			c := cases[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := call(g, m, i)
				outs[i][m] = out
				if err != nil {
					errs <- fmt.Errorf("member %d %s: %w", m, c.name, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return outs
}

// checkReduced checks one case: identical bits on every member, integers
// and min/max exact, float sums within rounding of a float64 reference
// (rounding to the wire type, when the case compresses).
func checkReduced(t *testing.T, c reduceCase, outs [][]byte) {
	t.Helper()
	for m := range outs {
		require.True(t, bytes.Equal(outs[0], outs[m]), "%s: member %d differs from member 0", c.name, m)
	}
	switch c.dt {
	case Int32:
		require.Equal(t, intReference(c.red, typed[int32](c.ins)), view[int32](outs[0]), c.name)
	case Int64:
		require.Equal(t, intReference(c.red, typed[int64](c.ins)), view[int64](outs[0]), c.name)
	case Int8:
		require.Equal(t, intReference(c.red, typed[int8](c.ins)), view[int8](outs[0]), c.name)
	default:
		var ins [][]float64
		for _, in := range c.ins {
			ins = append(ins, floats(c.dt, in))
		}
		want, tol := floatReference(cmp.Or(c.wire, c.dt), c.red, ins)
		got := floats(c.dt, outs[0])
		for i := range want {
			if math.Abs(want[i]-got[i]) > tol[i] || (tol[i] == 0 && want[i] != got[i]) {
				require.InDelta(t, want[i], got[i], tol[i], "%s element %d", c.name, i)
			}
		}
	}
}

func typed[T int8 | int32 | int64](bs [][]byte) [][]T {
	var out [][]T
	for _, b := range bs {
		out = append(out, append([]T{}, view[T](b)...))
	}
	return out
}

func TestAllReduceLargeBuffersUseChunkedRing(t *testing.T) {
	const chunk = 64 << 10
	for _, tr := range testTransports {
		gs := newGroups(t, 3, append(tr.opts, func(c *config) { c.chunkBytes = chunk })...)
		rng := rand.New(rand.NewPCG(9, 9))
		c := reduceCase{name: "large", dt: Float32, red: Sum}
		elems := 3*(chunk/4)*5 + 5 // five chunks per segment, uneven, past the direct path
		for range gs {
			c.ins = append(c.ins, randomBuffer(rng, Float32, elems))
		}
		checkReduced(t, c, runConcurrently(t, gs, []reduceCase{c})[0])
	}
}

func TestAllReduceUnalignedBuffers(t *testing.T) {
	gs := newGroups(t, 2, smallChunks)
	errs := onAll(gs, func(i int, g *Group) error {
		for _, elems := range []int{3, 100} {
			raw := make([]byte, elems*8+1)
			data := raw[1:]
			for j := range elems {
				data[8*j] = byte(i + 1) // int64 value i+1, little-endian
			}
			if err := g.AllReduce(context.Background(), fmt.Sprint(elems), Sum, Int64, data); err != nil {
				return err
			}
			for j := range elems {
				if data[8*j] != 3 {
					return fmt.Errorf("element %d = %d, want 3", j, data[8*j])
				}
			}
		}
		return nil
	})
	requireAllOK(t, errs)
}

func TestSingleMemberOpsAreLocal(t *testing.T) {
	g := newGroups(t, 1)[0]
	ctx := context.Background()
	data := []byte{7, 0, 0, 0}
	require.NoError(t, g.AllReduce(ctx, "x", Mean, Int32, data))
	assert.Equal(t, []byte{7, 0, 0, 0}, data)
	out, err := g.AllGather(ctx, "g", Int32, data)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{7, 0, 0, 0}}, out)
	require.NoError(t, g.Broadcast(ctx, "b", 0, Int32, data))
	require.NoError(t, g.Barrier(ctx, "barrier"))
	assert.Equal(t, 0, g.Rank())
	assert.Equal(t, 1, g.Size())
	assert.Equal(t, Stats{}, g.Stats(), "a member alone sends nothing")
}

// Stats counts every operation a member started, by kind, and the payload
// bytes it sent: 4 per all-reduce, all-gather and (from the root)
// broadcast to its one peer.
func TestStatsCountOperations(t *testing.T) {
	gs := newGroups(t, 2)
	ctx := context.Background()
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		data := []byte{1, 0, 0, 0}
		for k := range 3 {
			if err := g.AllReduce(ctx, fmt.Sprintf("r%d", k), Sum, Int32, data); err != nil {
				return err
			}
		}
		if _, err := g.AllGather(ctx, "g", Int32, data); err != nil {
			return err
		}
		if err := g.Broadcast(ctx, "b", 0, Int32, data); err != nil {
			return err
		}
		return g.Barrier(ctx, "barrier")
	}))
	for i, g := range gs {
		sent := int64(4 * (3 + 1))
		if i == 0 {
			sent += 4 // the broadcast's root
		}
		st := g.Stats()
		st.PeerWait = 0 // timing: TestRecordsNameTheLastMember
		assert.Equal(t, Stats{AllReduces: 3, AllGathers: 1, Broadcasts: 1, Barriers: 1, BytesSent: sent}, st, "member %d", i)
	}
}

func TestConcurrentOpsInDifferentOrders(t *testing.T) {
	const names = 20
	gs := newGroups(t, 4, smallChunks)
	errs := onAll(gs, func(m int, g *Group) error {
		var wg sync.WaitGroup
		errs := make([]error, names)
		for _, i := range rand.New(rand.NewPCG(uint64(m), 3)).Perm(names) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = mixedOp(g, i)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	})
	requireAllOK(t, errs)
}

// mixedOp runs the i-th operation of a mix of all kinds and checks it.
func mixedOp(g *Group, i int) error {
	ctx := context.Background()
	name := fmt.Sprintf("op-%d", i)
	rank := int32(g.Rank())
	data := make([]byte, 4*(i*37+1))
	for j := range view[int32](data) {
		view[int32](data)[j] = rank + int32(j)
	}
	switch i % 4 {
	case 0:
		if err := g.AllReduce(ctx, name, Max, Int32, data); err != nil {
			return err
		}
		if got, want := view[int32](data)[0], int32(g.Size()-1); got != want {
			return fmt.Errorf("%s: max %d, want %d", name, got, want)
		}
	case 1:
		out, err := g.AllGather(ctx, name, Int32, data)
		if err != nil {
			return err
		}
		if len(out) != g.Size() || view[int32](out[g.Size()-1])[0] != int32(g.Size()-1) {
			return fmt.Errorf("%s: gathered %d buffers", name, len(out))
		}
	case 2:
		if err := g.Broadcast(ctx, name, i%g.Size(), Int32, data); err != nil {
			return err
		}
		if got := view[int32](data)[0]; got != int32(i%g.Size()) {
			return fmt.Errorf("%s: broadcast %d", name, got)
		}
	default:
		return g.Barrier(ctx, name)
	}
	return nil
}

func TestAllGatherDifferentLengths(t *testing.T) {
	overTestTransports(t, 3, testAllGatherDifferentLengths)
}

func testAllGatherDifferentLengths(t *testing.T, gs []*Group) {
	lengths := []int{0, 3, 1000} // 1000 float64 elements span many chunks
	outs := make([][][]byte, len(gs))
	ins := make([][]byte, len(gs))
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range gs {
		ins[i] = randomBuffer(rng, Float64, lengths[i])
	}
	errs := onAll(gs, func(i int, g *Group) error {
		var err error
		outs[i], err = g.AllGather(context.Background(), "g", Float64, ins[i])
		return err
	})
	requireAllOK(t, errs)
	for i := range gs {
		require.Len(t, outs[i], len(gs))
		for r := range gs {
			assert.Equal(t, len(ins[r]), len(outs[i][r]), "member %d's copy of %d", i, r)
			assert.True(t, bytes.Equal(ins[r], outs[i][r]), "member %d's copy of %d", i, r)
		}
	}
}

func TestBroadcastFromEachRoot(t *testing.T) {
	overTestTransports(t, 3, testBroadcastFromEachRoot)
}

func testBroadcastFromEachRoot(t *testing.T, gs []*Group) {
	for root := range gs {
		for _, elems := range []int{0, 1, 999} {
			bufs := make([][]byte, len(gs))
			for i := range gs {
				bufs[i] = randomBuffer(rand.New(rand.NewPCG(uint64(i), 0)), Int64, elems)
			}
			want := append([]byte(nil), bufs[root]...)
			errs := onAll(gs, func(i int, g *Group) error {
				return g.Broadcast(context.Background(), "b", root, Int64, bufs[i])
			})
			requireAllOK(t, errs)
			for i := range gs {
				require.True(t, bytes.Equal(want, bufs[i]), "root %d, member %d, %d elements", root, i, elems)
			}
		}
	}
}

func TestBarrierWaitsForEveryMember(t *testing.T) {
	gs := newGroups(t, 3)
	arrived := make(chan int, len(gs))
	var late sync.WaitGroup
	late.Add(1)
	errs := onAll(gs, func(i int, g *Group) error {
		if i == 2 {
			late.Wait() // the last member enters only once the others are waiting
		}
		arrived <- i
		if i == 0 {
			go late.Done()
		}
		err := g.Barrier(context.Background(), "b")
		if i != 2 && len(arrived) < len(gs) {
			return fmt.Errorf("member %d passed the barrier before member 2 arrived", i)
		}
		return err
	})
	requireAllOK(t, errs)
}

// AllReduceTo leaves its source as it was and writes into its destination
// what AllReduce computes in place, on the direct path and the ring.
func TestAllReduceToLeavesTheSourceAlone(t *testing.T) {
	gs := newGroups(t, 3, smallChunks, everyChunkRemote)
	errs := onAll(gs, func(i int, g *Group) error {
		for _, elems := range []int{5, 40_001} {
			src := make([]byte, 8*elems)
			for j := range elems {
				binary.LittleEndian.PutUint64(src[8*j:], uint64(i*elems+j))
			}
			orig := append([]byte(nil), src...)
			dst := make([]byte, len(src))
			name := fmt.Sprint(elems)
			if err := g.AllReduceTo(context.Background(), name, Sum, Int64, dst, src); err != nil {
				return err
			}
			if !bytes.Equal(src, orig) {
				return fmt.Errorf("%d elements: the source changed", elems)
			}
			if err := g.AllReduce(context.Background(), name, Sum, Int64, src); err != nil {
				return err
			}
			if !bytes.Equal(dst, src) {
				return fmt.Errorf("%d elements: AllReduceTo and AllReduce disagree", elems)
			}
			for j := range elems {
				if got, want := binary.LittleEndian.Uint64(dst[8*j:]), uint64(3*elems+3*j); got != want {
					return fmt.Errorf("%d elements: element %d = %d, want %d", elems, j, got, want)
				}
			}
		}
		return nil
	})
	requireAllOK(t, errs)
}
