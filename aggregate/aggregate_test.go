package aggregate_test

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
)

// Each rule gives the result worked out by hand on small inputs, and
// reports the votes it discarded.
func TestAggregateSmallInputs(t *testing.T) {
	line := [][]float32{{0}, {1}, {2}, {3}, {10}}
	for _, c := range []struct {
		rule      aggregate.Rule
		votes     [][]float32
		want      []float32
		discarded []int
	}{
		{aggregate.Mean(), [][]float32{{1, 2}, {3, 4}, {5, 9}}, []float32{3, 5}, nil},
		{aggregate.Mean(), [][]float32{{1, -1}, {2, 0.5}}, []float32{1.5, -0.25}, nil},
		{aggregate.Median(), [][]float32{{1, 10, -3}, {2, -5, 0}, {3, 7, 100}}, []float32{2, 7, 0}, nil},
		{aggregate.Median(), [][]float32{{1, 10}, {2, -5}, {3, 7}, {8, 0}}, []float32{2.5, 3.5}, nil},
		// Sorted columns: 1 1 1.5 2 100 | -100 1 2 2.5 3 | 0 1 3 3.5 4.
		// Vote 1 is dropped in two coordinates of three, vote 2 in all,
		// vote 0 in one: of the equal 1s the lower index counts as smaller.
		{aggregate.TrimmedMean(1), [][]float32{{1, 2, 3}, {2, 3, 4}, {100, -100, 0}, {1.5, 2.5, 3.5}, {1, 1, 1}},
			[]float32{1.5, float32(5.5 / 3), 2.5}, []int{1, 2}},
		{aggregate.TrimmedMean(1), [][]float32{{1}, {2}, {3}, {10}}, []float32{2.5}, []int{0, 3}},
		{aggregate.TrimmedMean(0), [][]float32{{1}, {2}, {6}}, []float32{3}, nil},
		// Squared distances to the 2 nearest others: 1+4, 1+1, 1+1, 1+4,
		// 49+64. Votes 1 and 2 tie; the lower index wins.
		{aggregate.Krum(1), line, []float32{1}, []int{0, 2, 3, 4}},
		{aggregate.MultiKrum(1, 1), line, []float32{1}, []int{0, 2, 3, 4}},
		{aggregate.MultiKrum(1, 3), line, []float32{1}, []int{3, 4}},
		{aggregate.MultiKrum(1, 4), line, []float32{1.5}, []int{4}},
	} {
		out, discarded := run(c.rule, c.votes)
		assert.Equal(t, bits(c.want), bits(out), "%v of %v", c.rule, c.votes)
		assert.Equal(t, c.discarded, discarded, "%v of %v: discarded", c.rule, c.votes)
	}
}

// Centered clipping gives the result worked out by hand, to float32's
// precision, and reports the votes it clipped in the last iteration.
func TestCenteredClipSmallInputs(t *testing.T) {
	for _, c := range []struct {
		rule      aggregate.Rule
		votes     [][]float32
		want      []float32
		discarded []int
	}{
		// From the median 2 the differences -2 -1 0 4 8 clip to -2 -1 0 2
		// 2, whose mean is 0.2; votes 3 and 4 were clipped, vote 0 is at
		// distance exactly tau.
		{aggregate.CenteredClip(2, 1), [][]float32{{0}, {1}, {2}, {6}, {10}}, []float32{2.2}, []int{3, 4}},
		// From 2.2: -2.2 -1.2 -0.2 3.8 7.8 clip to -2 -1.2 -0.2 2 2.
		{aggregate.CenteredClip(2, 2), [][]float32{{0}, {1}, {2}, {6}, {10}}, []float32{2.32}, []int{0, 3, 4}},
		// Clipping is to a Euclidean norm: (3,4) has norm 5, clipped to 1.
		{aggregate.CenteredClip(1, 1), [][]float32{{0, 0}, {3, 4}, {0, 0}, {0, 0}, {0, 0}}, []float32{0.12, 0.16}, []int{1}},
	} {
		out, discarded := run(c.rule, c.votes)
		assert.InDeltaSlice(t, c.want, out, 1e-6, "%v of %v", c.rule, c.votes)
		assert.Equal(t, c.discarded, discarded, "%v of %v: discarded", c.rule, c.votes)
	}
}

// The mean of identical votes is that vote to the bit, -0 and subnormals
// included, and every rule returns the common vote when all agree.
func TestIdenticalVotes(t *testing.T) {
	x := []float32{-0, 0, 1.5, -2.25, math.SmallestNonzeroFloat32, -math.MaxFloat32, math.MaxFloat32, 1e-20, float32(math.Pi)}
	for n := 1; n <= 9; n++ {
		votes := make([][]float32, n)
		for i := range votes {
			votes[i] = x
		}
		out, _ := run(aggregate.Mean(), votes)
		assert.Equal(t, bits(x), bits(out), "mean of %d", n)
	}
	y := x[2:] // CenteredClip returns +0 for -0
	votes := [][]float32{y, y, y, y, y}
	for _, r := range allRules() {
		out, _ := run(r, votes)
		assert.Equal(t, y, out, r)
	}
}

// With 5 workers of which one Byzantine, sign-flipped and scaled by 100
// or replaced by noise of scale 1e6, the robust rules stay among the
// honest votes: per coordinate within their range (median, trimmed mean),
// or no farther from their mean than the farthest honest vote (Krum,
// multi-Krum, centered clipping). The mean is pulled far away. Krum,
// multi-Krum and centered clipping discard the Byzantine vote, and so
// does the trimmed mean.
func TestRobustToOneByzantineVote(t *testing.T) {
	const n, d, byz = 5, 200, 2
	rng := rand.New(rand.NewPCG(3, 4))
	center := gaussianVotes(rng, 1, d)[0]
	honestVotes := gaussianVotes(rng, n, d)
	for _, v := range honestVotes {
		for j := range v {
			v[j] = center[j] + 0.1*v[j]
		}
	}
	for _, a := range []struct {
		name   string
		attack func(j int) float32
	}{
		{"sign flip", func(j int) float32 { return -100 * honestVotes[byz][j] }},
		{"noise", func(int) float32 { return float32(1e6 * rng.NormFloat64()) }},
	} {
		name := a.name
		votes := make([][]float32, n)
		var honest [][]float32
		for i, v := range honestVotes {
			votes[i] = v
			if i != byz {
				honest = append(honest, v)
			}
		}
		votes[byz] = make([]float32, d)
		for j := range votes[byz] {
			votes[byz][j] = a.attack(j)
		}
		honestMean, _ := run(aggregate.Mean(), honest)
		radius := 0.0
		for _, v := range honest {
			radius = max(radius, distance(v, honestMean))
		}

		mean, _ := run(aggregate.Mean(), votes)
		assert.Greater(t, distance(mean, honestMean), 20*radius, "%s: mean", name)

		for _, r := range []aggregate.Rule{aggregate.Median(), aggregate.TrimmedMean(1)} {
			out, discarded := run(r, votes)
			for j, x := range out {
				lo, hi := honest[0][j], honest[0][j]
				for _, v := range honest {
					lo, hi = min(lo, v[j]), max(hi, v[j])
				}
				require.True(t, lo <= x && x <= hi, "%s: %v: coordinate %d = %v outside the honest [%v, %v]", name, r, j, x, lo, hi)
			}
			if r.String() != "median" {
				assert.Equal(t, []int{byz}, discarded, "%s: %v", name, r)
			}
		}
		for _, r := range []aggregate.Rule{aggregate.Krum(1), aggregate.MultiKrum(1, 3), aggregate.CenteredClip(1, 3)} {
			out, discarded := run(r, votes)
			assert.LessOrEqual(t, distance(out, honestMean), radius, "%s: %v", name, r)
			assert.Contains(t, discarded, byz, "%s: %v", name, r)
		}
	}
}

// Permuting the votes leaves the output of the coordinate-wise rules
// unchanged to the bit, even where float64 sums of the values round
// differently in different orders.
func TestCoordinateWiseRulesIgnoreVoteOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 1; n <= 9; n++ {
		votes := wildVotes(rng, n, 2000)
		for _, r := range []aggregate.Rule{aggregate.Mean(), aggregate.Median(), aggregate.TrimmedMean((n - 1) / 3)} {
			want, _ := run(r, votes)
			for range 5 {
				shuffled := make([][]float32, n)
				for i, p := range rng.Perm(n) {
					shuffled[i] = votes[p]
				}
				out, _ := run(r, shuffled)
				require.Equal(t, bits(want), bits(out), "%v of %d votes", r, n)
			}
		}
	}
}

// The mean is that of the exact sum where float64 sums would cancel
// large values and lose a small one, in some orders or all.
func TestMeanIgnoresVoteOrderWhereSumsRound(t *testing.T) {
	a, b, c := float32(1e30), float32(1e-30), float32(-1e30)
	for _, votes := range [][][]float32{{{a}, {b}, {c}}, {{b}, {a}, {c}}, {{a}, {c}, {b}}} {
		out, _ := run(aggregate.Mean(), votes)
		assert.Equal(t, float32(float64(b)/3), out[0], "mean of %v", votes)
	}
}

// Each coordinate of the mean is the exact sum of the values, rounded to
// float64, divided by n and rounded to float32, also where values cancel
// and their magnitudes are spread just too far for float64 sums to be
// exact.
func TestMeanIsOfTheExactSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{2, 3, 5, 16} {
		const d = 20000
		votes := make([][]float32, n)
		for i := range votes {
			votes[i] = make([]float32, d)
		}
		column := make([]float32, n)
		for j := range d {
			spread := 20 + rng.IntN(20)
			for i := range column {
				if i > 0 && rng.IntN(2) == 0 {
					column[i] = -column[rng.IntN(i)]
					continue
				}
				m := float64(rng.Uint32N(1<<24)|1) * float64(1-2*rng.IntN(2))
				column[i] = float32(math.Ldexp(m, rng.IntN(spread)))
			}
			rng.Shuffle(n, func(a, b int) { column[a], column[b] = column[b], column[a] })
			for i, x := range column {
				votes[i][j] = x
			}
		}
		out, _ := run(aggregate.Mean(), votes)
		for j, x := range out {
			sum := new(big.Float).SetPrec(1000)
			for _, v := range votes {
				sum.Add(sum, big.NewFloat(float64(v[j])))
			}
			s, _ := sum.Float64()
			require.Equal(t, float32(s/float64(n)), x, "n = %d, coordinate %d", n, j)
		}
	}
}

// The same votes give the same output and discarded votes to the bit on
// every call, whatever out held before.
func TestAggregateIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, votes := range [][][]float32{gaussianVotes(rng, 5, 3000), wildVotes(rng, 5, 3000)} {
		for _, r := range allRules() {
			want, wantDiscarded := run(r, votes)
			out := make([]float32, len(want))
			for j := range out {
				out[j] = float32(math.NaN())
			}
			discarded := r.Aggregate(votes, out)
			assert.Equal(t, bits(want), bits(out), r)
			assert.Equal(t, wantDiscarded, discarded, r)
		}
	}
}

// MultiKrum(f, 1) is Krum(f).
func TestMultiKrumOfOneIsKrum(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, votes := range [][][]float32{gaussianVotes(rng, 7, 500), wildVotes(rng, 7, 500)} {
		for f := range 3 {
			want, wantDiscarded := run(aggregate.Krum(f), votes)
			out, discarded := run(aggregate.MultiKrum(f, 1), votes)
			assert.Equal(t, bits(want), bits(out), "f = %d", f)
			assert.Equal(t, wantDiscarded, discarded, "f = %d", f)
		}
	}
}

// Check accepts the fewest workers a rule needs and rejects one fewer,
// with an error naming the rule, its parameters, n and the requirement;
// Aggregate panics with that error.
func TestCheckAtTheBoundary(t *testing.T) {
	for _, c := range []struct {
		rule aggregate.Rule
		n    int // the fewest workers accepted
		err  string
	}{
		{aggregate.Mean(), 1, "aggregate: mean needs at least 1 worker, got 0"},
		{aggregate.Median(), 1, "aggregate: median needs at least 1 worker, got 0"},
		{aggregate.CenteredClip(10, 3), 1, "aggregate: centered_clip(10,3) needs at least 1 worker, got 0"},
		{aggregate.TrimmedMean(0), 1, "aggregate: trimmed_mean(0) needs more than 2f = 0 workers, got 0"},
		{aggregate.TrimmedMean(2), 5, "aggregate: trimmed_mean(2) needs more than 2f = 4 workers, got 4"},
		{aggregate.Krum(0), 3, "aggregate: krum(0) needs more than 2f+2 = 2 workers, got 2"},
		{aggregate.Krum(1), 5, "aggregate: krum(1) needs more than 2f+2 = 4 workers, got 4"},
		{aggregate.Krum(2), 7, "aggregate: krum(2) needs more than 2f+2 = 6 workers, got 6"},
		{aggregate.MultiKrum(1, 3), 5, "aggregate: multi_krum(1,3) needs more than 2f+2 = 4 workers, got 4"},
		{aggregate.MultiKrum(1, 5), 6, "aggregate: multi_krum(1,5) needs at least f+m = 6 workers, got 5"},
	} {
		assert.NoError(t, c.rule.Check(c.n), c.rule)
		assert.NoError(t, c.rule.Check(c.n+10), c.rule)
		assert.EqualError(t, c.rule.Check(c.n-1), c.err)
		votes := make([][]float32, c.n-1)
		for i := range votes {
			votes[i] = []float32{1}
		}
		assert.PanicsWithError(t, c.err, func() { c.rule.Aggregate(votes, []float32{0}) }, c.rule)
	}
	assert.EqualError(t, aggregate.Krum(2).Check(5), "aggregate: krum(2) needs more than 2f+2 = 6 workers, got 5")
}

// Bad parameters do not panic in the constructors; they make a rule
// whose Check fails for every n, naming the parameter and its value.
func TestInvalidParameters(t *testing.T) {
	for _, c := range []struct {
		rule aggregate.Rule
		err  string
	}{
		{aggregate.TrimmedMean(-1), "aggregate: trimmed_mean(-1): f must be >= 0"},
		{aggregate.Krum(-2), "aggregate: krum(-2): f must be >= 0"},
		{aggregate.MultiKrum(-1, 2), "aggregate: multi_krum(-1,2): f must be >= 0"},
		{aggregate.MultiKrum(1, 0), "aggregate: multi_krum(1,0): m must be >= 1"},
		{aggregate.CenteredClip(0, 3), "aggregate: centered_clip(0,3): tau must be > 0 and finite"},
		{aggregate.CenteredClip(-1.5, 3), "aggregate: centered_clip(-1.5,3): tau must be > 0 and finite"},
		{aggregate.CenteredClip(math.NaN(), 3), "aggregate: centered_clip(NaN,3): tau must be > 0 and finite"},
		{aggregate.CenteredClip(math.Inf(1), 3), "aggregate: centered_clip(+Inf,3): tau must be > 0 and finite"},
		{aggregate.CenteredClip(10, 0), "aggregate: centered_clip(10,0): iterations must be >= 1"},
	} {
		for _, n := range []int{0, 1, 5, 100} {
			assert.EqualError(t, c.rule.Check(n), c.err, "n = %d", n)
		}
		assert.PanicsWithError(t, c.err, func() { c.rule.Aggregate([][]float32{{1}}, []float32{0}) })
	}
}

// Aggregate panics when a vote's length differs from out's.
func TestAggregateRejectsMismatchedLengths(t *testing.T) {
	for _, r := range allRules() {
		votes := [][]float32{{1, 2}, {1, 2}, {1, 2}, {1}, {1, 2}}
		assert.PanicsWithValue(t, "aggregate: "+r.String()+": vote 3 has 1 elements, out has 2",
			func() { r.Aggregate(votes, make([]float32, 2)) })
	}
}

// Votes of no elements aggregate to nothing, and a single worker's vote
// is the result of every rule that accepts one worker.
func TestEmptyVotesAndOneWorker(t *testing.T) {
	for _, r := range allRules() {
		discarded := r.Aggregate(make([][]float32, 5), []float32{})
		assert.NotContains(t, discarded, 0, "%v of empty votes: the first counts", r)
	}
	vote := []float32{1, -2, 3.5}
	for _, r := range []aggregate.Rule{aggregate.Mean(), aggregate.Median(), aggregate.TrimmedMean(0), aggregate.CenteredClip(1, 2)} {
		out, discarded := run(r, [][]float32{vote})
		assert.Equal(t, vote, out, r)
		assert.Nil(t, discarded, r)
	}
	assert.Error(t, aggregate.Krum(0).Check(1))
}
