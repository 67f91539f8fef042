package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scatterCases returns sums, means and maxima of float32 buffers whose
// elements differ in scale by up to 10^6, so that another order of
// addition gives other bits, of lengths shorter than the group, not
// dividing by it, and beyond the engine's direct size.
func scatterCases(rng *rand.Rand, n int) []reduceCase {
	return floatCases(rng, n, 0, []int{0, 1, n + 1, 1000, 5003, 70000}, []Reduction{Sum, Mean, Max},
		func(int) float64 { return math.Pow(10, float64(rng.IntN(7)-3)) })
}

// ReduceScatter gives each member its block of the all-reduce's result,
// bit for bit, on either path of the all-reduce (direct up to its size,
// the ring beyond), over shared memory and over TCP; the blocks, gathered
// in rank order, make up the whole buffer, and AllGatherBlocks puts them
// together on every member; a member sends (n-1)/n of it.
func TestReduceScatterIsTheAllReducesBlock(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		for _, path := range []struct {
			name string
			tune func(*config)
		}{{"direct", nil}, {"ring", ringOnly}} {
			for _, tcp := range []bool{false, true} {
				if tcp && n != 3 {
					continue
				}
				t.Run(fmt.Sprintf("members=%d/%s/tcp=%v", n, path.name, tcp), func(t *testing.T) {
					gs := newGroups(t, n, append(optional(path.tune), WithSharedMemory(!tcp))...)
					checkReduceScatter(t, gs)
				})
			}
		}
	}
}

// checkReduceScatter checks scatterCases' reduce-scatters on gs against
// their all-reduces.
func checkReduceScatter(t *testing.T, gs []*Group) {
	n := len(gs)
	cases := scatterCases(rand.New(rand.NewPCG(uint64(n), 14)), n)
	all := runConcurrently(t, gs, cases)
	before := gs[0].Stats()
	blocks := runEach(t, gs, cases, func(g *Group, m, i int) ([]byte, error) {
		c := cases[i]
		_, l := ScatterBlock(len(c.ins[m])/c.dt.Size(), n, m)
		dst := append([]byte(nil), make([]byte, l*c.dt.Size())...) // nil when empty, as runConcurrently's
		return dst, g.ReduceScatter(context.Background(), c.name, c.red, c.dt, dst, c.ins[m])
	})
	after := gs[0].Stats()
	gathered := runEach(t, gs, cases, func(g *Group, m, i int) ([]byte, error) {
		dst := append([]byte(nil), make([]byte, len(cases[i].ins[m]))...)
		return dst, g.AllGatherBlocks(context.Background(), cases[i].name, Float32, dst, blocks[i][m])
	})
	var total int
	for i, c := range cases {
		var whole []byte
		for m := range n {
			s, l := ScatterBlock(len(c.ins[m])/4, n, m)
			require.Equal(t, append([]byte(nil), all[i][m][s*4:(s+l)*4]...), blocks[i][m], "%s: member %d's block", c.name, m)
			whole = append(whole, blocks[i][m]...)
		}
		require.Equal(t, all[i][0], whole, "%s: the blocks in rank order", c.name)
		for m := range n {
			require.Equal(t, all[i][m], gathered[i][m], "%s: member %d's AllGatherBlocks", c.name, m)
		}
		total += len(c.ins[0])
	}
	assert.Equal(t, int64(len(cases)), after.ReduceScatters-before.ReduceScatters)
	assert.InDelta(t, float64(total)*float64(n-1)/float64(n), float64(after.BytesSent-before.BytesSent), float64(len(cases)*4),
		"a member sends (n-1)/n of each buffer")
}

// Compressed to int8, a reduce-scatter gives each member its block of the
// all-reduce compressed alike, bit for bit, for sums and means, on either
// path (the direct path's is that all-reduce); around the ring it sends a
// quarter of float32's bytes, and its blocks' maxima, whose all-reduce
// sends a 128th.
func TestReduceScatterInt8IsTheAllReducesBlock(t *testing.T) {
	onEachPath(t, func(t *testing.T, gs []*Group) {
		n := len(gs)
		cases := int8Cases(rand.New(rand.NewPCG(uint64(n), 15)), n)
		all := runConcurrently(t, gs, cases)
		blocks := runEach(t, gs, cases, func(g *Group, m, i int) ([]byte, error) {
			_, l := ScatterBlock(len(cases[i].ins[m])/4, n, m)
			dst := append([]byte(nil), make([]byte, 4*l)...) // nil when empty, as runConcurrently's
			return dst, g.ReduceScatter(context.Background(), cases[i].name, cases[i].red, Float32, dst, cases[i].ins[m], Compress(Int8))
		})
		for i, c := range cases {
			for m := range n {
				s, l := ScatterBlock(len(c.ins[m])/4, n, m)
				require.Equal(t, append([]byte(nil), all[i][m][4*s:4*(s+l)]...), blocks[i][m], "%s: member %d's block", c.name, m)
			}
		}
	})
	gs := newGroups(t, 4, ringOnly)
	x := make([]byte, 4*64*int8Block)
	sent := func(opts ...CallOption) int64 {
		before := gs[0].Stats().BytesSent
		requireAllOK(t, onAll(gs, func(m int, g *Group) error {
			_, l := ScatterBlock(len(x)/4, 4, m)
			return g.ReduceScatter(context.Background(), "x", Sum, Float32, make([]byte, 4*l), x, opts...)
		}))
		return gs[0].Stats().BytesSent - before
	}
	plain, int8 := sent(), sent(Compress(Int8))
	assert.InDelta(t, 0.25+1.0/128, float64(int8)/float64(plain), 0.001, "%d bytes, float32 %d", int8, plain)
}

// Bad calls are errors naming what is wrong, before anything is sent.
func TestReduceScatterBadInput(t *testing.T) {
	gs := newGroups(t, 2)
	ctx := context.Background()
	src := make([]byte, 5*4)
	assert.ErrorContains(t, gs[0].ReduceScatter(ctx, "rs", Sum, Float32, make([]byte, 4), src),
		`reduce-scatter "rs": member 0's block of 12 bytes of 20 into 4 bytes`)
	assert.ErrorContains(t, gs[0].ReduceScatter(ctx, "rs", Reduction(99), Float32, make([]byte, 12), src), `reduce-scatter "rs": unknown`)
	assert.ErrorContains(t, gs[0].ReduceScatter(ctx, "rs", Sum, Float32, make([]byte, 12), src, Compress(Float16)), "and reduce-scatters to int8")
	assert.ErrorContains(t, gs[0].ReduceScatter(ctx, "rs", Max, Float32, make([]byte, 12), src, Compress(Int8)), "cannot compress float32 to int8")
	assert.ErrorContains(t, gs[0].ReduceScatter(ctx, "rs", Sum, Float32, make([]byte, 12), src, InTreeOrder()), "only uncompressed all-reduces combine in tree order")
	assert.ErrorContains(t, gs[0].AllGatherBlocks(ctx, "ag", Float32, src, make([]byte, 4)),
		`all-gather "ag": member 0's block of 12 bytes of 20, not 4 bytes`)
	assert.Zero(t, gs[0].Stats().BytesSent)
}

// A member that reduce-scatters where another all-reduces under the same
// name fails, as the other does, with a *MismatchError naming the call.
func TestReduceScatterMismatch(t *testing.T) {
	gs := newGroups(t, 2)
	errs := onAll(gs, func(i int, g *Group) error {
		if i == 0 {
			return g.ReduceScatter(context.Background(), "grads", Sum, Float32, make([]byte, 2000), make([]byte, 4000))
		}
		return g.AllReduce(context.Background(), "grads", Sum, Float32, make([]byte, 4000))
	})
	for i, err := range errs {
		var me *MismatchError
		require.ErrorAs(t, err, &me, "member %d", i)
		assert.Equal(t, "grads", me.Name, "member %d", i)
	}
	assert.ErrorContains(t, errs[0], "reduce-scatter")
}
