package aggregate

import (
	"math"
	"math/big"
)

func (r mean) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	average(votes, out)
	return nil
}

func (r median) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	trim(votes, (len(votes)-1)/2, out, nil)
	return nil
}

func (r trimmedMean) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	if r.f == 0 {
		trim(votes, 0, out, nil)
		return nil
	}
	trimmed := make([]int, len(votes))
	trim(votes, r.f, out, trimmed)
	var discarded []int
	for i, c := range trimmed {
		if 2*c > len(out) {
			discarded = append(discarded, i)
		}
	}
	return discarded
}

// average writes into out the coordinate-wise mean of votes.
func average(votes [][]float32, out []float32) {
	var a averager
	xs := make([]float32, len(votes))
	for j := range out {
		for i, v := range votes {
			xs[i] = v[j]
		}
		out[j] = a.mean(xs)
	}
}

// trim writes into out, for each coordinate, the mean of the votes'
// values without the f smallest and the f largest. If trimmed is not nil,
// trimmed[i] is increased by the number of coordinates where vote i was
// dropped; among equal values, lower indices count as smaller.
func trim(votes [][]float32, f int, out []float32, trimmed []int) {
	var a averager
	n := len(votes)
	col := make([]int64, n)
	xs := make([]float32, n-2*f)
	for j := range out {
		column(votes, j, col)
		for k, e := range col[f : n-f] {
			xs[k] = value(e)
		}
		out[j] = a.mean(xs)
		if trimmed != nil {
			for _, e := range col[:f] {
				trimmed[uint32(e)]++
			}
			for _, e := range col[n-f:] {
				trimmed[uint32(e)]++
			}
		}
	}
}

// An averager computes means of float32 values that depend on their
// multiset alone, to the bit.
type averager struct {
	sum, x big.Float // for sums float64 would round
}

// mean returns the exact sum of xs rounded to float64, divided by len(xs)
// and rounded to float32. Where float64 sums of xs are exact in any order
// it adds them in order; elsewhere it adds them exactly in a big.Float.
func (a *averager) mean(xs []float32) float32 {
	if len(xs) == 1 {
		return xs[0] // what the division by 1 below would give
	}
	sum := float64(xs[0])
	lo, hi := absBits(xs[0])-1, absBits(xs[0]) // lo ignores zeros: 0-1 wraps to the maximum
	for _, x := range xs[1:] {
		sum += float64(x)
		lo, hi = min(lo, absBits(x)-1), max(hi, absBits(x))
	}
	if !exactInFloat64(len(xs), lo+1, hi) {
		// A float32 has at most 277 significant bits from 2¹²⁷ to 2⁻¹⁴⁹;
		// 320 leave room for the carries of 2⁴³ of them.
		a.sum.SetPrec(320).SetFloat64(float64(xs[0]))
		for _, x := range xs[1:] {
			a.sum.Add(&a.sum, a.x.SetFloat64(float64(x)))
		}
		sum, _ = a.sum.Float64()
	}
	return float32(sum / float64(len(xs)))
}

func absBits(x float32) uint32 { return math.Float32bits(x) &^ (1 << 31) }

// exactInFloat64 reports whether float64 sums of n float32 values, the
// smallest nonzero of absolute value with bits lo (0 if all are zero) and
// the largest with bits hi, are exact in every order. A float32 of
// magnitude a is a multiple of a power of two greater than a·2⁻²⁴, and so
// is any sum of values no smaller; each partial sum is at most n·max in
// magnitude, so it fits float64's 53 bits when n·max <= 2²⁹·min.
func exactInFloat64(n int, lo, hi uint32) bool {
	if lo == 0 {
		return true
	}
	small, large := math.Float32frombits(lo), math.Float32frombits(hi)
	return float64(n)*float64(large) <= 0x1p29*float64(small)
}

// column fills col, of len(votes), with coordinate j of the votes in
// ascending order, each as order(value)<<32 | index. It inserts each
// value with min and max, which compile to conditional moves: no branch
// depends on the data.
func column(votes [][]float32, j int, col []int64) {
	col[0] = int64(order(votes[0][j])) << 32
	for i := 1; i < len(votes); i++ {
		e := int64(order(votes[i][j]))<<32 | int64(i)
		col[i] = max(col[i-1], e)
		for k := i - 1; k > 0; k-- {
			col[k] = max(col[k-1], min(col[k], e))
		}
		col[0] = min(col[0], e)
	}
}

// order maps x to an int32 that sorts as IEEE 754's totalOrder does, -0
// before +0, so that sorted columns are the same bits whatever the order
// of the votes.
func order(x float32) int32 { return int32(flipNegative(math.Float32bits(x))) }

// value returns the float32 in an element of column.
func value(e int64) float32 { return math.Float32frombits(flipNegative(uint32(e >> 32))) }

// flipNegative inverts the magnitude bits of negative values, which makes
// larger negative floats smaller integers; it is its own inverse.
func flipNegative(b uint32) uint32 {
	if b>>31 != 0 {
		return b ^ math.MaxInt32
	}
	return b
}
