package train_test

import (
	"testing"

	"github.com/tfdist/tfdist/dataset"
)

// overfitting returns 60 training digits in batches of 20 (3 steps an
// epoch) and 100 held-out ones in batches of 50: too few to learn from
// for long, so that the validation loss falls and then rises.
func overfitting(t testing.TB) (trainSet, val dataset.Dataset) {
	t.Helper()
	d, held := digitsData(t)
	return dataset.Batched(sliceDS(t, d, 60), 20, false), dataset.Batched(sliceDS(t, held, 100), 50, false)
}

// argmin returns the first index of the smallest of v.
func argmin(v []float64) int {
	best := 0
	for i, x := range v {
		if x < v[best] {
			best = i
		}
	}
	return best
}
