package faults

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
)

func TestParseVoteAttack(t *testing.T) {
	a, err := ParseVoteAttack("worker=2,kind=signflip")
	require.NoError(t, err)
	assert.Equal(t, &VoteAttack{Worker: 2, Kind: SignFlip, Scale: 100}, a)
	a, err = ParseVoteAttack("worker=0, kind=alie, scale=1.5")
	require.NoError(t, err)
	assert.Equal(t, 1.5, a.Scale)
	for s, want := range map[string]string{
		"kind=noise":                 "expected worker=W",
		"worker=1,kind=bogus":        `kind "bogus"`,
		"worker=x,kind=noise":        `"worker=x"`,
		"worker=1,kind=noise,volume": "expected key=value",
	} {
		_, err := ParseVoteAttack(s)
		assert.ErrorContains(t, err, want, s)
	}
}

// Apply replaces only the attacker's vote, the same way on every call
// with the same step, and leaves the votes it was given unchanged.
func TestApply(t *testing.T) {
	votes := [][]float32{{1, 2}, {3, 4}, {5, 6}}
	flip := (&VoteAttack{Worker: 1, Kind: SignFlip, Scale: 10}).Apply(0, votes)
	assert.Equal(t, [][]float32{{1, 2}, {-30, -40}, {5, 6}}, flip)
	assert.Equal(t, []float32{3, 4}, votes[1], "the given votes are not changed")

	noise := &VoteAttack{Worker: 0, Kind: Noise, Scale: 1, Seed: 7}
	assert.Equal(t, noise.Apply(3, votes), noise.Apply(3, votes), "every worker draws the same noise at a step")
	assert.NotEqual(t, noise.Apply(3, votes)[0], noise.Apply(4, votes)[0])

	alie := (&VoteAttack{Worker: 2, Kind: LittleIsEnough, Scale: 1}).Apply(0, votes)
	assert.Equal(t, []float32{1, 2}, alie[2], "mean 2, 3 minus one standard deviation 1")

	nan := (&VoteAttack{Worker: 0, Kind: NaN}).Apply(0, votes)
	assert.True(t, math.IsNaN(float64(nan[0][1])))
	var none *VoteAttack
	assert.Equal(t, votes, none.Apply(0, votes))
}

// Baruch et al.'s z: for 5 workers and 1 attacker about 0.25 (the
// normal quantile of 3/5); for 4 and 1, whose s is half the workers, 0.
func TestALIEZ(t *testing.T) {
	assert.InDelta(t, 0.253, alieZ(5, 1), 1e-3)
	assert.InDelta(t, 0.0, alieZ(4, 1), 1e-9)
}

// Rule is the inner rule run on the attacked votes, one step per call
// (Noise draws afresh each step), named as the inner rule; a NaN attack
// is refused, since the strategies set NaN votes aside before any rule.
func TestRule(t *testing.T) {
	votes := [][]float32{{1, 2}, {3, 4}, {5, 6}}
	r, err := (&VoteAttack{Worker: 2, Kind: SignFlip, Scale: 10}).Rule(aggregate.Mean())
	require.NoError(t, err)
	assert.Equal(t, "mean", r.String())
	require.NoError(t, r.Check(3))
	out := make([]float32, 2)
	assert.Empty(t, r.Aggregate(votes, out))
	assert.Equal(t, []float32{(1 + 3 - 50) / 3.0, (2 + 4 - 60) / 3.0}, out)
	assert.Equal(t, []float32{5, 6}, votes[2], "the given votes are not changed")

	noise, err := (&VoteAttack{Worker: 0, Kind: Noise, Scale: 1, Seed: 7}).Rule(aggregate.Mean())
	require.NoError(t, err)
	first, second := make([]float32, 2), make([]float32, 2)
	noise.Aggregate(votes, first)
	noise.Aggregate(votes, second)
	assert.NotEqual(t, first, second, "each call is a new step")

	_, err = (&VoteAttack{Worker: 0, Kind: NaN}).Rule(aggregate.Median())
	assert.ErrorContains(t, err, "kind nan")
	_, err = (&VoteAttack{Worker: 0, Kind: SignFlip}).Rule(nil)
	assert.ErrorContains(t, err, "nil rule")
}
