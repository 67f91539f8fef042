package aggregate_test

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAggregate measures each rule on n = 5 votes of d = 2²⁰
// elements; MB/s counts the bytes of the votes read per call.
func BenchmarkAggregate(b *testing.B) {
	const n, d = 5, 1 << 20
	votes := gaussianVotes(rand.New(rand.NewPCG(1, 2)), n, d)
	out := make([]float32, d)
	for _, r := range allRules() {
		b.Run(r.String(), func(b *testing.B) {
			b.SetBytes(n * d * 4)
			for range b.N {
				r.Aggregate(votes, out)
			}
		})
	}
}
