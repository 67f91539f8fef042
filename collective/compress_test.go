package collective

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ringOnly sends every non-empty all-reduce around the ring, in chunks of
// 256 compressed elements.
func ringOnly(c *config) {
	c.chunkBytes = 512
	c.directMax = 0
}

var wireTypes = []DType{Float16, BFloat16}

// Compressed all-reduces give every member the same bits, within per-hop
// 16-bit rounding of the exact result and, for all but the shortest,
// outside float32 rounding of it: the data did travel compressed.
func TestCompressedAllReduce(t *testing.T) {
	onEachPath(t, func(t *testing.T, gs []*Group) {
		cases := compressedCases(rand.New(rand.NewPCG(uint64(len(gs)), 11)), len(gs))
		outs := runConcurrently(t, gs, cases)
		for i, c := range cases {
			checkReduced(t, c, outs[i])
			if len(c.ins[0]) >= 4*7 {
				assert.True(t, beyondFloat32(c, outs[i][0]), "%s: result within float32 rounding: not compressed", c.name)
			}
		}
	})
}

// onEachPath runs test on groups of 2, 3 and 5 members, whose all-reduces
// go by the direct path, then around the ring.
func onEachPath(t *testing.T, test func(t *testing.T, gs []*Group)) {
	for _, n := range []int{2, 3, 5} {
		for _, path := range []struct {
			name string
			tune func(*config)
		}{{"direct", nil}, {"ring", ringOnly}} {
			t.Run(fmt.Sprintf("members=%d/%s", n, path.name), func(t *testing.T) {
				test(t, newGroups(t, n, optional(path.tune)...))
			})
		}
	}
}

// Over shared memory the reader reduces compressed frames where they lie
// in the ring, and over TCP it copies them into a buffer first: every
// member gets the same bits either way, and with members of both kinds in
// one ring.
func TestCompressedAllReduceSameBitsOverEitherTransport(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			cases := compressedCases(rand.New(rand.NewPCG(uint64(n), 12)), n)
			run := func(each func(int) []Option) [][][]byte {
				lns, members := listeners(t, n)
				gs, err := formGroups(lns, members, each, ringOnly)
				require.NoError(t, err)
				defer closeAll(gs)
				return runConcurrently(t, gs, cases)
			}
			tcp := run(func(int) []Option { return []Option{WithSharedMemory(false)} })
			shm := run(nil)
			mixed := run(func(i int) []Option { return optional(func(c *config) { c.sharedMemory = i != 1 }) })
			for i, c := range cases {
				for m := range n {
					assert.Equal(t, tcp[i][m], shm[i][m], "%s, member %d: shared memory and TCP differ", c.name, m)
					assert.Equal(t, tcp[i][m], mixed[i][m], "%s, member %d: mixed transports and TCP differ", c.name, m)
				}
			}
		})
	}
}

// compressedCases returns sums and means of float32 buffers of several
// lengths, most not dividing by n, compressed to each wire type.
func compressedCases(rng *rand.Rand, n int) []reduceCase {
	var cases []reduceCase
	for _, elems := range []int{0, 1, 7, 10*n + 1, 1001, 5003} {
		for _, wire := range wireTypes {
			for _, red := range []Reduction{Sum, Mean} {
				c := reduceCase{name: fmt.Sprintf("%v/%v/%d", wire, red, elems), dt: Float32, red: red, wire: wire}
				for range n {
					c.ins = append(c.ins, randomBuffer(rng, Float32, elems))
				}
				cases = append(cases, c)
			}
		}
	}
	return cases
}

// beyondFloat32 reports whether some element of out is further from the
// exact result than float32 rounding allows.
func beyondFloat32(c reduceCase, out []byte) bool {
	var ins [][]float64
	for _, in := range c.ins {
		ins = append(ins, floats(Float32, in))
	}
	want, tol := floatReference(Float32, c.red, ins)
	for i, got := range floats(Float32, out) {
		if math.Abs(got-want[i]) > tol[i] {
			return true
		}
	}
	return false
}

// A large buffer goes around the ring in many pipelined chunks of the
// default size.
func TestCompressedAllReduceLargeBuffer(t *testing.T) {
	gs := newGroups(t, 3, func(c *config) { c.chunkBytes = 64 << 10 })
	rng := rand.New(rand.NewPCG(4, 4))
	var cases []reduceCase
	for _, wire := range wireTypes {
		c := reduceCase{name: "large/" + wire.String(), dt: Float32, red: Mean, wire: wire}
		for range gs {
			c.ins = append(c.ins, randomBuffer(rng, Float32, 3*(32<<10)*4+5)) // four chunks per segment
		}
		cases = append(cases, c)
	}
	outs := runConcurrently(t, gs, cases)
	for i, c := range cases {
		checkReduced(t, c, outs[i])
	}
}

// AllReduceTo compressed leaves its source alone, unaligned buffers go
// through an aligned copy, and both give what AllReduce gives in place.
func TestCompressedAllReduceToUnaligned(t *testing.T) {
	gs := newGroups(t, 2, ringOnly)
	rng := rand.New(rand.NewPCG(6, 6))
	ins := [][]byte{randomBuffer(rng, Float32, 1000), randomBuffer(rng, Float32, 1000)}
	errs := onAll(gs, func(i int, g *Group) error {
		for _, wire := range wireTypes {
			want := append([]byte(nil), ins[i]...)
			if err := g.AllReduce(context.Background(), "a", Sum, Float32, want, Compress(wire)); err != nil {
				return err
			}
			raw := make([]byte, 2*len(ins[i])+2)
			src, dst := raw[1:len(ins[i])+1], raw[len(ins[i])+1:len(raw)-1]
			copy(src, ins[i])
			if err := g.AllReduceTo(context.Background(), "b", Sum, Float32, dst, src, Compress(wire)); err != nil {
				return err
			}
			if !bytes.Equal(src, ins[i]) {
				return fmt.Errorf("%v: the source changed", wire)
			}
			if !bytes.Equal(dst, want) {
				return fmt.Errorf("%v: AllReduceTo of unaligned buffers differs from AllReduce", wire)
			}
		}
		return nil
	})
	requireAllOK(t, errs)
}

// Members that disagree on compression all fail, naming both sides.
func TestCompressMismatch(t *testing.T) {
	cases := []struct {
		name string
		tune func(*config)
		wire func(rank int) DType
		has  [2]string
	}{
		{"one plain direct", nil, func(r int) DType { return [...]DType{0, Float16, Float16}[r] },
			[2]string{"float32[1000] uncompressed", "float32[1000] compressed to float16"}},
		{"one plain ring", ringOnly, func(r int) DType { return [...]DType{Float16, Float16, 0}[r] },
			[2]string{"float32[1000] compressed to float16", "float32[1000] uncompressed"}},
		{"float16 and bfloat16", ringOnly, func(r int) DType { return [...]DType{Float16, BFloat16, BFloat16}[r] },
			[2]string{"float32[1000] compressed to float16", "float32[1000] compressed to bfloat16"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			gs := newGroups(t, 3, optional(c.tune)...)
			errs := onAll(gs, func(i int, g *Group) error {
				var opts []CallOption
				if w := c.wire(i); w != 0 {
					opts = append(opts, Compress(w))
				}
				return g.AllReduce(context.Background(), "grads", Sum, Float32, make([]byte, 4000), opts...)
			})
			for i, err := range errs {
				var me *MismatchError
				require.ErrorAs(t, err, &me, "member %d", i)
				assert.Equal(t, "grads", me.Name, "member %d", i)
				assert.ElementsMatch(t, c.has[:], me.Has[:], "member %d: %v", i, err)
			}
		})
	}
}

// Compress applies to float32 all-reduces only, to 16-bit floats only; any
// other use fails before anything is sent, naming the call.
func TestCompressBadArguments(t *testing.T) {
	noLeaks(t)
	gs := newGroups(t, 2)
	ctx := context.Background()
	g, data := gs[0], make([]byte, 64)
	errs := []error{
		g.AllReduce(ctx, "ints", Sum, Int32, data, Compress(Float16)),
		g.AllReduce(ctx, "doubles", Sum, Float64, data, Compress(BFloat16)),
		g.AllReduce(ctx, "wide", Sum, Float32, data, Compress(Float32)),
		g.Broadcast(ctx, "bcast", 0, Float32, data, Compress(Float16)),
	}
	_, err := g.AllGather(ctx, "gather", Float32, data, Compress(Float16))
	errs = append(errs, err)
	_, err = newGroups(t, 1)[0].AllGather(ctx, "alone", Float32, data, Compress(Float16))
	errs = append(errs, err)
	want := []string{
		`all-reduce "ints": cannot compress int32 to float16`,
		`all-reduce "doubles": cannot compress float64 to bfloat16`,
		`all-reduce "wide": cannot compress float32 to float32`,
		`broadcast "bcast": cannot compress float32 to float16`,
		`all-gather "gather": cannot compress float32 to float16`,
		`all-gather "alone": cannot compress float32 to float16`,
	}
	for i, err := range errs {
		assert.ErrorContains(t, err, want[i])
	}
	assert.Equal(t, Stats{}, g.Stats(), "no operation started")
	requireAllOK(t, onAll(gs, func(_ int, g *Group) error { return g.Barrier(ctx, "after") }))
}
