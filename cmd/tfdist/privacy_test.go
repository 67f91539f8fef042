package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/accountant"
)

// privacy epsilon and privacy noise print, as text or one JSON line, what
// the accountant computes; bad values are usage errors naming them.
func TestPrivacyCommands(t *testing.T) {
	code, out, errOut := runHere(nil, "", "privacy", "epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1",
		"--steps", "10000", "--delta", "1e-5", "--json")
	require.Equal(t, exitOK, code, errOut)
	var e struct{ Epsilon, Order float64 }
	require.NoError(t, json.Unmarshal([]byte(out), &e))
	wantEps, wantOrder, err := accountant.Epsilon(0.01, 1.1, 10000, 1e-5)
	require.NoError(t, err)
	assert.Equal(t, wantEps, e.Epsilon)
	assert.Equal(t, wantOrder, e.Order)

	code, out, errOut = runHere(nil, "", "privacy", "noise", "--sampling-rate", "0.01", "--steps", "10000", "--delta", "1e-5",
		"--target-epsilon", "3", "--json")
	require.Equal(t, exitOK, code, errOut)
	var n struct {
		NoiseMultiplier float64 `json:"noise_multiplier"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &n))
	eps, _, err := accountant.Epsilon(0.01, n.NoiseMultiplier, 10000, 1e-5)
	require.NoError(t, err)
	assert.LessOrEqual(t, eps, 3.0)
	assert.Greater(t, eps, 2.99)

	code, out, _ = runHere(nil, "", "privacy", "epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "10000", "--delta", "1e-5")
	assert.Equal(t, exitOK, code)
	assert.Regexp(t, `^epsilon 5\.63\d* for delta 1e-05 after 10000 steps .*Renyi order 4\.7\)\n$`, out)

	code, _, errOut = runHere(nil, "", "privacy", "epsilon", "--sampling-rate", "2", "--noise-multiplier", "1", "--steps", "1", "--delta", "1e-5")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "sampling rate 2: expected a rate in (0, 1]")
	code, _, errOut = runHere(nil, "", "privacy", "noise", "--sampling-rate", "0.1", "--steps", "10", "--delta", "3", "--target-epsilon", "1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "delta 3: expected a value in (0, 1)")
}
