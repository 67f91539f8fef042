package accountant_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/accountant"
	"github.com/tfdist/tfdist/internal/pyenv"
)

// reference runs dp_accounting 0.6.0 on the epsilon cases (q, noise,
// steps, delta) and the noise cases (q, steps, delta, target).
func reference(t *testing.T, epsCases, noiseCases [][4]float64) (eps [][2]*float64, noise []float64) {
	var out struct {
		Epsilon [][2]*float64 `json:"epsilon"`
		Noise   []float64     `json:"noise"`
	}
	pyenv.DPAccounting(t).JSON(t, "testdata/dp_accounting_reference.py",
		map[string]any{"epsilon": nonNil(epsCases), "noise": nonNil(noiseCases)}, &out)
	require.Len(t, out.Epsilon, len(epsCases))
	require.Len(t, out.Noise, len(noiseCases))
	return out.Epsilon, out.Noise
}

// On a grid of sampling rates, noise multipliers, steps and deltas, ε and
// its order equal dp_accounting's to 1e-4 relative.
func TestEpsilonMatchesDPAccounting(t *testing.T) {
	var cases [][4]float64
	for _, q := range []float64{1e-3, 1e-2, 0.1, 0.5, 1} {
		for _, noise := range []float64{0.5, 0.8, 1.1, 2, 5, 10} {
			for _, steps := range []float64{1, 10, 1000, 1e5} {
				for _, delta := range []float64{1e-3, 1e-5, 1e-7} {
					cases = append(cases, [4]float64{q, noise, steps, delta})
				}
			}
		}
	}
	want, _ := reference(t, cases, nil)
	for i, c := range cases {
		eps, order, err := accountant.Epsilon(c[0], c[1], int(c[2]), c[3])
		require.NoError(t, err, c)
		if want[i][0] == nil {
			assert.True(t, math.IsInf(eps, 1), "%v: dp_accounting gives +Inf, got %v", c, eps)
			continue
		}
		w := *want[i][0]
		assert.InDelta(t, w, eps, 1e-4*max(w, 1e-12), "q, noise, steps, delta = %v", c)
		if w > 0 {
			assert.Equal(t, *want[i][1], order, "q, noise, steps, delta = %v", c)
		}
	}
}

// The noise multiplier found for a target ε spends at most that ε, and
// equals dp_accounting's calibration to its tolerance.
func TestNoiseMultiplierMatchesDPAccounting(t *testing.T) {
	cases := [][4]float64{{0.01, 1000, 1e-5, 1}, {0.004, 10000, 1e-5, 3}, {0.1, 100, 1e-6, 8}, {1, 1, 1e-5, 0.5}, {0.02, 50000, 1e-7, 2}}
	_, want := reference(t, nil, cases)
	for i, c := range cases {
		noise, err := accountant.NoiseMultiplier(c[0], int(c[1]), c[2], c[3])
		require.NoError(t, err, c)
		assert.InDelta(t, want[i], noise, 2e-6*max(1, want[i]), "q, steps, delta, target = %v", c)
		eps, _, err := accountant.Epsilon(c[0], noise, int(c[1]), c[2])
		require.NoError(t, err)
		assert.LessOrEqual(t, eps, c[3], "%v: the noise found reaches the target", c)
		less, _, _ := accountant.Epsilon(c[0], noise-1e-5, int(c[1]), c[2])
		assert.Greater(t, less, c[3], "%v: less noise does not", c)
	}
}

func nonNil(c [][4]float64) [][4]float64 {
	if c == nil {
		return [][4]float64{}
	}
	return c
}
