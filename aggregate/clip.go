package aggregate

import "math"

func (r centeredClip) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	Median().Aggregate(votes, out)
	var clipped []int
	for range r.iterations {
		clipped = clipStep(votes, r.tau, out)
	}
	return clipped
}

// clipStep moves v by the mean of the votes' differences from v, each
// clipped to norm tau, and returns the indices of the clipped votes.
func clipStep(votes [][]float32, tau float64, v []float32) (clipped []int) {
	n := len(votes)
	rows := append(votes[:n:n], v)
	pairs := make([][2]int, n)
	for i := range pairs {
		pairs[i] = [2]int{i, n}
	}
	scale := squaredDistances(rows, pairs)
	for i, d2 := range scale {
		scale[i] = 1
		if d := math.Sqrt(d2); d > tau {
			scale[i] = tau / d
			clipped = append(clipped, i)
		}
	}
	for j, c := range v {
		center := float64(c)
		var sum float64
		for i, x := range votes {
			sum += float64(scale[i] * (float64(x[j]) - center)) // never an FMA
		}
		v[j] = float32(center + sum/float64(n))
	}
	return clipped
}
