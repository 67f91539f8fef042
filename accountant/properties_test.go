package accountant_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/accountant"
)

func epsilon(t *testing.T, q, noise float64, steps int, delta float64) float64 {
	t.Helper()
	eps, _, err := accountant.Epsilon(q, noise, steps, delta)
	require.NoError(t, err)
	return eps
}

// ε grows with the steps and the sampling rate and shrinks with the noise
// and δ; no step spends nothing, and no noise spends everything.
func TestEpsilonMovesTheWayPrivacyDoes(t *testing.T) {
	base := epsilon(t, 0.01, 1.1, 1000, 1e-5)
	assert.Greater(t, epsilon(t, 0.01, 1.1, 2000, 1e-5), base)
	assert.Greater(t, epsilon(t, 0.02, 1.1, 1000, 1e-5), base)
	assert.Less(t, epsilon(t, 0.01, 2.2, 1000, 1e-5), base)
	assert.Less(t, epsilon(t, 0.01, 1.1, 1000, 1e-3), base)
	assert.Zero(t, epsilon(t, 0.01, 1.1, 0, 1e-5))
	assert.True(t, math.IsInf(epsilon(t, 0.01, 0, 10, 1e-5), 1))
}

// Composing twice n steps spends what composing 2n steps at once does.
func TestCompositionAdds(t *testing.T) {
	a, err := accountant.New()
	require.NoError(t, err)
	require.NoError(t, a.ComposePoissonGaussian(0.05, 1.3, 500))
	require.NoError(t, a.ComposePoissonGaussian(0.05, 1.3, 500))
	got, order, err := a.Epsilon(1e-5)
	require.NoError(t, err)
	want, wantOrder, err := accountant.Epsilon(0.05, 1.3, 1000, 1e-5)
	require.NoError(t, err)
	assert.InDelta(t, want, got, 1e-12*want)
	assert.Equal(t, wantOrder, order)
	assert.Len(t, a.RDP(), len(accountant.DefaultOrders()))
	assert.Equal(t, 1.1, a.Orders()[0])
	assert.Equal(t, 1024.0, a.Orders()[len(a.Orders())-1])
}

// Extreme settings give finite, ordered answers, never NaN: the largest
// orders, a billion steps, tiny and whole sampling rates, huge noise.
func TestExtremesStayFinite(t *testing.T) {
	for _, c := range []struct {
		q, noise float64
		steps    int
	}{{1e-6, 0.5, 1e9}, {1, 0.3, 1e9}, {0.5, 100, 1}, {1e-3, 1e4, 1e9}, {0.999, 0.6, 10}} {
		eps, order, err := accountant.Epsilon(c.q, c.noise, c.steps, 1e-7)
		require.NoError(t, err)
		assert.False(t, math.IsNaN(eps), "%+v", c)
		assert.False(t, math.IsInf(eps, 0), "%+v", c)
		assert.GreaterOrEqual(t, eps, 0.0, "%+v", c)
		assert.Greater(t, order, 1.0, "%+v", c)
	}
}

// Every bad parameter is an error naming the value and the valid range.
func TestBadParametersAreNamed(t *testing.T) {
	_, _, err := accountant.Epsilon(0, 1, 10, 1e-5)
	assert.ErrorContains(t, err, "sampling rate 0: expected a rate in (0, 1]")
	_, _, err = accountant.Epsilon(1.5, 1, 10, 1e-5)
	assert.ErrorContains(t, err, "sampling rate 1.5")
	_, _, err = accountant.Epsilon(0.1, -1, 10, 1e-5)
	assert.ErrorContains(t, err, "noise multiplier -1: expected a finite value >= 0")
	_, _, err = accountant.Epsilon(0.1, 1, -3, 1e-5)
	assert.ErrorContains(t, err, "-3 steps: expected 0 or more")
	for _, d := range []float64{0, 1, -0.5, math.NaN()} {
		_, _, err = accountant.Epsilon(0.1, 1, 10, d)
		assert.ErrorContains(t, err, "expected a value in (0, 1)", d)
	}
	_, err = accountant.NoiseMultiplier(0.1, 10, 1e-5, 0)
	assert.ErrorContains(t, err, "target epsilon 0: expected a finite value > 0")
	_, err = accountant.NoiseMultiplier(1, 1e9, 1e-5, 1e-6)
	assert.ErrorContains(t, err, "cannot be reached in 1000000000 steps")
	_, err = accountant.New(1.5, 1)
	assert.ErrorContains(t, err, "RDP order 1: expected an order greater than 1")
}
