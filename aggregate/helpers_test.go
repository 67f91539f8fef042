package aggregate_test

import (
	"math"
	"math/rand/v2"

	"github.com/tfdist/tfdist/aggregate"
)

// allRules returns one of each rule, with parameters that 5 workers meet.
func allRules() []aggregate.Rule {
	return []aggregate.Rule{
		aggregate.Mean(),
		aggregate.Median(),
		aggregate.TrimmedMean(1),
		aggregate.Krum(1),
		aggregate.MultiKrum(1, 3),
		aggregate.CenteredClip(10, 3),
	}
}

// gaussianVotes returns n votes of d standard normal elements.
func gaussianVotes(rng *rand.Rand, n, d int) [][]float32 {
	votes := make([][]float32, n)
	for i := range votes {
		votes[i] = make([]float32, d)
		for j := range votes[i] {
			votes[i][j] = float32(rng.NormFloat64())
		}
	}
	return votes
}

// wildVotes returns n votes of d elements whose float64 sums round
// differently in different orders: magnitudes from 1e-30 to 1e30 of
// either sign, zeros of both signs, subnormals and values shared between
// votes.
func wildVotes(rng *rand.Rand, n, d int) [][]float32 {
	votes := make([][]float32, n)
	for i := range votes {
		votes[i] = make([]float32, d)
		for j := range votes[i] {
			var x float32
			switch rng.IntN(6) {
			case 0:
				x = float32(math.Copysign(0, rng.NormFloat64()))
			case 1:
				x = math.Float32frombits(rng.Uint32N(1<<23) | rng.Uint32()&(1<<31)) // subnormal
			case 2:
				if i > 0 {
					x = votes[rng.IntN(i)][j]
					break
				}
				fallthrough
			default:
				x = float32(rng.NormFloat64() * math.Pow(10, 60*rng.Float64()-30))
			}
			votes[i][j] = x
		}
	}
	return votes
}

// bits returns the IEEE 754 encodings of xs, for comparisons that tell
// -0 from +0.
func bits(xs []float32) []uint32 {
	b := make([]uint32, len(xs))
	for i, x := range xs {
		b[i] = math.Float32bits(x)
	}
	return b
}

// distance returns the Euclidean distance between a and b.
func distance(a, b []float32) float64 {
	var sum float64
	for j := range a {
		t := float64(a[j]) - float64(b[j])
		sum += t * t
	}
	return math.Sqrt(sum)
}

// run aggregates votes with r into a new slice.
func run(r aggregate.Rule, votes [][]float32) ([]float32, []int) {
	out := make([]float32, len(votes[0]))
	return out, r.Aggregate(votes, out)
}
