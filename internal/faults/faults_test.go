package faults

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
