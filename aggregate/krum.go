package aggregate

import (
	"cmp"
	"slices"
)

func (r krum) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	n := len(votes)
	scores := krumScores(votes, r.f)
	best := make([]int, n)
	for i := range best {
		best[i] = i
	}
	slices.SortStableFunc(best, func(a, b int) int { return cmp.Compare(scores[a], scores[b]) })
	chosen, discarded := best[:r.m], best[r.m:]
	slices.Sort(chosen)
	slices.Sort(discarded)
	picked := make([][]float32, len(chosen))
	for k, i := range chosen {
		picked[k] = votes[i]
	}
	average(picked, out)
	if len(discarded) == 0 {
		return nil
	}
	return slices.Clip(discarded)
}

// krumScores returns each vote's Krum score: the sum of its squared
// distances to its n-f-2 nearest other votes, added from the smallest.
func krumScores(votes [][]float32, f int) []float64 {
	n := len(votes)
	var pairs [][2]int
	for i := range n {
		for k := i + 1; k < n; k++ {
			pairs = append(pairs, [2]int{i, k})
		}
	}
	dist := squaredDistances(votes, pairs)
	near := make([][]float64, n)
	for p, ik := range pairs {
		near[ik[0]] = append(near[ik[0]], dist[p])
		near[ik[1]] = append(near[ik[1]], dist[p])
	}
	scores := make([]float64, n)
	for i, d := range near {
		slices.Sort(d)
		for _, x := range d[:n-f-2] {
			scores[i] += x
		}
	}
	return scores
}

// block is the number of coordinates squaredDistances reads at a time,
// few enough for the rows' blocks to stay in cache.
const block = 2048

// squaredDistances returns, for each pair of indices into rows, the
// squared Euclidean distance between the two rows, summed in float64 in
// coordinate order.
func squaredDistances(rows [][]float32, pairs [][2]int) []float64 {
	dist := make([]float64, len(pairs))
	d := len(rows[0])
	for lo := 0; lo < d; lo += block {
		hi := min(lo+block, d)
		for p, ik := range pairs {
			a, b := rows[ik[0]][lo:hi], rows[ik[1]][lo:hi]
			sum := dist[p]
			for j, x := range a {
				t := float64(x) - float64(b[j])
				sum += float64(t * t) // never an FMA
			}
			dist[p] = sum
		}
	}
	return dist
}
