package collective

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// treeOf sums leaves[lo:hi] along the tree of InTreeOrder, in float32.
func treeOf(leaves [][]float32) []float32 {
	out := make([]float32, len(leaves[0]))
	if len(leaves) == 1 {
		copy(out, leaves[0])
		return out
	}
	mid := len(leaves) / 2
	left, right := treeOf(leaves[:mid]), treeOf(leaves[mid:])
	for i := range out {
		out[i] = left[i] + right[i]
	}
	return out
}

// Eight leaves spread over 1, 2, 4 or 8 members, each member holding the
// tree's sum of its aligned block of leaves, all-reduce in tree order to
// the sum of the eight leaves' tree, bit for bit, whatever the number of
// members: small buffers (all gathered) and large ones (by segment), in
// many small chunks or in chunks read from the peers' memory. Summed in
// rank order instead, the members' blocks give other bits.
func TestTreeOrderIsTheSameForEveryNumberOfMembers(t *testing.T) {
	const leavesN = 8
	for _, n := range []int{64, 3 << 16} { // 256 bytes, 768 KiB
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		leaves := make([][]float32, leavesN)
		for l := range leaves {
			leaves[l] = make([]float32, n)
			for i := range leaves[l] {
				leaves[l][i] = float32(rng.NormFloat64() * float64(int(1)<<rng.IntN(20))) // mixed magnitudes
			}
		}
		want := treeOf(leaves)
		for _, members := range []int{1, 2, 4, 8} {
			per := leavesN / members
			blocks := make([][]float32, members)
			for r := range blocks {
				blocks[r] = treeOf(leaves[r*per : (r+1)*per])
			}
			opts := []Option{smallChunks}
			if members == 4 {
				opts = nil // default chunks: read from the peers' memory
			}
			gs := newGroups(t, members, opts...)
			got := make([][]float32, members)
			stopGC := collectGarbage() // a buffer peers read by its address must stay alive
			requireAllOK(t, onAll(gs, func(r int, g *Group) error {
				got[r] = append([]float32(nil), blocks[r]...)
				data := bytesOf(got[r][:n])
				return g.AllReduce(context.Background(), "grad", Sum, Float32, data, InTreeOrder())
			}))
			stopGC()
			for r := range got {
				require.Equal(t, want, got[r], "%d floats over %d members: member %d", n, members, r)
			}
			if members == 4 {
				inRankOrder := make([]float32, n)
				for i := range inRankOrder {
					inRankOrder[i] = ((blocks[0][i] + blocks[1][i]) + blocks[2][i]) + blocks[3][i]
				}
				assert.NotEqual(t, want, inRankOrder, "the grouping changes the bits: the test can fail")
			}
		}
	}
}

// collectGarbage collects garbage over and over, and allocates and fills
// memory meanwhile, until stop is called: memory freed too early is reused
// at once, with other bytes.
func collectGarbage() (stop func()) {
	old := debug.SetGCPercent(1)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			default:
				runtime.GC()
				junk := make([]byte, 192<<10)
				for i := range junk {
					junk[i] = 0xff
				}
			}
		}
	}()
	return func() { close(done); <-exited; debug.SetGCPercent(old) }
}

// Members that disagree on the order fail, naming it; compression and
// other operations refuse it.
func TestTreeOrderMustBeAgreed(t *testing.T) {
	gs := newGroups(t, 2)
	errs := onAll(gs, func(r int, g *Group) error {
		var opts []CallOption
		if r == 0 {
			opts = append(opts, InTreeOrder())
		}
		return g.AllReduce(context.Background(), "grad", Sum, Float32, make([]byte, 16), opts...)
	})
	var mismatch *MismatchError
	require.True(t, errors.As(errs[0], &mismatch), "%v", errs[0])
	assert.ErrorContains(t, errs[0], "in tree order")
	assert.ErrorContains(t, errs[0], "in rank order")

	g := newGroups(t, 2)[0]
	err := g.AllReduce(context.Background(), "c", Sum, Float32, make([]byte, 16), InTreeOrder(), Compress(Float16))
	assert.ErrorContains(t, err, "InTreeOrder")
	_, err = g.AllGather(context.Background(), "g", Float32, make([]byte, 16), InTreeOrder())
	assert.ErrorContains(t, err, "InTreeOrder")
}
