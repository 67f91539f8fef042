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

// int8Cases returns sums and means compressed to int8 of float32 buffers
// whose blocks of int8Block elements differ in scale by up to 10^6, of
// lengths that cut a block or not.
func int8Cases(rng *rand.Rand, n int) []reduceCase {
	return floatCases(rng, n, Int8, []int{0, 1, int8Block - 1, int8Block, 3*int8Block + 7, 5003}, []Reduction{Sum, Mean},
		func(i int) float64 { return math.Pow(10, float64(i/int8Block%7-3)) })
}

// floatCases returns a case of every reduction in reds of float32 buffers
// of every length in elems, sent as wire (0: float32), each member's
// element i normal times scale(i).
func floatCases(rng *rand.Rand, n int, wire DType, elems []int, reds []Reduction, scale func(i int) float64) []reduceCase {
	var cases []reduceCase
	for _, e := range elems {
		for _, red := range reds {
			c := reduceCase{name: fmt.Sprintf("%v/%v/%d", wire, red, e), dt: Float32, red: red, wire: wire}
			for range n {
				x := make([]float32, e)
				for i := range x {
					x[i] = float32(rng.NormFloat64() * scale(i))
				}
				c.ins = append(c.ins, bytesOf(x))
			}
			cases = append(cases, c)
		}
	}
	return cases
}

// An all-reduce compressed to int8 gives every member the same bits, each
// element within half a level of each member's block maximum of the exact
// sum (for a mean, that over n), whatever the blocks' scales: (n/2)·
// max/127 on the direct path, (n/2)·max/(127/n) around the ring; and it
// is not exact: the data did travel as int8.
func TestInt8AllReduce(t *testing.T) {
	onEachPath(t, func(t *testing.T, gs []*Group) {
		n := len(gs)
		cases := int8Cases(rand.New(rand.NewPCG(uint64(n), 13)), n)
		outs := runConcurrently(t, gs, cases)
		for i, c := range cases {
			for m := range n {
				require.Equal(t, outs[i][0], outs[i][m], "%s: member %d differs from member 0", c.name, m)
			}
			levels := 127
			if gs[0].cfg.directMax == 0 {
				levels = int8Levels(n)
			}
			want, bound := int8Reference(c, n, levels)
			got := view[float32](outs[i][0])
			exact := true
			for k := range want {
				require.InDelta(t, want[k], float64(got[k]), bound[k], "%s element %d", c.name, k)
				exact = exact && math.Abs(want[k]-float64(got[k])) <= 1e-6*math.Abs(want[k])
			}
			if len(want) >= int8Block {
				assert.False(t, exact, "%s: exact to float32: not quantized", c.name)
			}
		}
	})
}

// int8Reference returns the exact sum or mean of c's inputs and the bound
// of its error under Compress(Int8) in a group of n whose members round
// to levels levels.
func int8Reference(c reduceCase, n, levels int) (want, bound []float64) {
	ins := make([][]float64, n)
	for m := range n {
		ins[m] = floats(Float32, c.ins[m])
	}
	want, bound = make([]float64, len(ins[0])), make([]float64, len(ins[0]))
	for b := 0; b*int8Block < len(want); b++ {
		var mx float64
		for _, in := range ins {
			for _, v := range in[b*int8Block : min(len(in), (b+1)*int8Block)] {
				mx = max(mx, math.Abs(v))
			}
		}
		for k := b * int8Block; k < min(len(want), (b+1)*int8Block); k++ {
			for _, in := range ins {
				want[k] += in[k]
			}
			// n roundings of half a level, and float32's rounding of
			// the levels' sum times the scale.
			bound[k] = float64(n)/2*mx/float64(levels) + 1e-6*mx*float64(n)
			if c.red == Mean {
				want[k] /= float64(n)
				bound[k] /= float64(n)
			}
		}
	}
	return want, bound
}

// A buffer larger than the engine's largest pooled payload (4 MiB of
// int8) goes through as any other.
func TestInt8AllReduceLargeBuffer(t *testing.T) {
	gs := newGroups(t, 2)
	c := reduceCase{name: "large", dt: Float32, red: Mean, wire: Int8}
	rng := rand.New(rand.NewPCG(5, 5))
	for range gs {
		c.ins = append(c.ins, randomBuffer(rng, Float32, 4<<20+5))
	}
	outs := runConcurrently(t, gs, []reduceCase{c})
	require.Equal(t, outs[0][0], outs[0][1], "both members hold the same bits")
	want, bound := int8Reference(c, 2, int8Levels(2))
	for k, got := range view[float32](outs[0][0]) {
		if math.Abs(want[k]-float64(got)) > bound[k] {
			require.InDelta(t, want[k], float64(got), bound[k], "element %d", k)
		}
	}
}

// A block holding a NaN on any member, or an infinity, sums to NaN on
// every member; a block of zeros sums to zeros; the other blocks are
// untouched by them; on either path.
func TestInt8AllReduceNonFinite(t *testing.T) {
	for levels, tune := range map[int]func(*config){127: nil, int8Levels(3): ringOnly} {
		gs := newGroups(t, 3, optional(tune)...)
		outs := make([][]float32, len(gs))
		errs := onAll(gs, func(i int, g *Group) error {
			x := make([]float32, 4*int8Block)
			for k := range x {
				x[k] = float32(k%int8Block + 1)
			}
			clear(x[int8Block : 2*int8Block])
			x[2*int8Block+5] = [...]float32{1, float32(math.NaN()), 1}[i]
			x[3*int8Block+9] = [...]float32{float32(math.Inf(-1)), 1, 1}[i]
			outs[i] = x
			return g.AllReduce(context.Background(), "x", Sum, Float32, bytesOf(x), Compress(Int8))
		})
		requireAllOK(t, errs)
		for i, out := range outs {
			require.Equal(t, bytesOf(outs[0]), bytesOf(out), "member %d", i)
		}
		for k, v := range outs[0] {
			switch k / int8Block {
			case 0:
				assert.InDelta(t, 3*float64(k+1), v, 1.5*int8Block/float64(levels)*(1+1e-5), "%d levels: element %d", levels, k)
			case 1:
				assert.Zero(t, v, "%d levels: element %d", levels, k)
			default:
				assert.True(t, math.IsNaN(float64(v)), "%d levels: element %d: %v", levels, k, v)
			}
		}
	}
}

// Compressed to int8, an all-reduce sends a quarter of float32's bytes,
// and its blocks' maxima, a 256th of them.
func TestInt8AllReduceSendsAQuarter(t *testing.T) {
	gs := newGroups(t, 4, ringOnly)
	x := make([]byte, 4*64*int8Block)
	sent := func(opts ...CallOption) int64 {
		before := gs[0].Stats().BytesSent
		requireAllOK(t, onAll(gs, func(_ int, g *Group) error {
			return g.AllReduce(context.Background(), "x", Sum, Float32, append([]byte(nil), x...), opts...)
		}))
		return gs[0].Stats().BytesSent - before
	}
	plain, int8 := sent(), sent(Compress(Int8))
	assert.InDelta(t, 0.25+1.0/256, float64(int8)/float64(plain), 0.001, "%d bytes, float32 %d", int8, plain)
}

// A member that compresses to int8 and one that does not fail alike, on
// either path; int8 takes only sums and means.
func TestInt8Mismatch(t *testing.T) {
	for want, tune := range map[string]func(*config){
		"compressed to int8 gathers every member's levels":              nil,
		"compressed to int8 agrees first on the maxima of its 4 blocks": ringOnly,
	} {
		gs := newGroups(t, 2, optional(tune)...)
		errs := onAll(gs, func(i int, g *Group) error {
			return g.AllReduce(context.Background(), "grads", Sum, Float32, make([]byte, 4000), Compress([...]DType{Int8, Float16}[i]))
		})
		for i, err := range errs {
			var me *MismatchError
			require.ErrorAs(t, err, &me, "member %d", i)
			assert.Equal(t, "grads", me.Name, "member %d", i)
		}
		assert.ErrorContains(t, errs[0], want)
	}
	err := newGroups(t, 2)[0].AllReduce(context.Background(), "max", Max, Float32, make([]byte, 64), Compress(Int8))
	assert.ErrorContains(t, err, `all-reduce "max": cannot compress float32 to int8: only float32 all-reduces compress, to float16 or bfloat16, or, summing or averaging, to int8`)
}

// A group of more than 127 members cannot sum int8 levels without
// overflow: a buffer past the direct path is refused, naming the group's
// size.
func TestInt8RefusesLargeGroups(t *testing.T) {
	g := &Group{members: make([]Member, 128), cfg: config{directMax: 8}}
	x := make([]byte, 64)
	err := g.allReduceInt8(context.Background(), "grads", Sum, x, x, nil)
	assert.EqualError(t, err, `collective: all-reduce "grads": cannot compress 16 elements to int8 in a group of 128 members: each would have no level (at most 127 members, or at most 8 elements)`)
}
