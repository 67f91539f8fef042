package accountant

import (
	"fmt"
	"math"
)

// Bounds of NoiseMultiplier's search.
const (
	maxNoise      = 1e6  // a target that needs more noise cannot be reached
	noiseAccuracy = 1e-6 // the answer is within this of the smallest noise that reaches the target
)

// NoiseMultiplier returns the smallest noise multiplier (within 1e-6)
// with which steps steps of DP-SGD at sampling rate q spend at most
// target ε for δ, found by bisection over Epsilon.
func NoiseMultiplier(q float64, steps int, delta, target float64) (float64, error) {
	if err := checkStep(q, 0, steps); err != nil {
		return 0, err
	}
	if err := checkDelta(delta); err != nil {
		return 0, err
	}
	if !(target > 0) || math.IsInf(target, 1) {
		return 0, fmt.Errorf("accountant: target epsilon %v: expected a finite value > 0", target)
	}
	reaches := func(noise float64) bool {
		eps, _, _ := Epsilon(q, noise, steps, delta)
		return eps <= target
	}
	lo, hi := 0.0, 1.0
	for !reaches(hi) {
		lo, hi = hi, 2*hi
		if hi > maxNoise {
			return 0, fmt.Errorf("accountant: target epsilon %v for delta %v cannot be reached in %d steps at sampling rate %v with a noise multiplier up to %g",
				target, delta, steps, q, float64(maxNoise))
		}
	}
	for hi-lo > noiseAccuracy {
		mid := lo + (hi-lo)/2
		if reaches(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}
