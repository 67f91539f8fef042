package dataset

// rng is a SplitMix64 generator (Steele, Lea and Flood, 2014). The package
// uses its own generator rather than math/rand so that a shuffle's order is
// a documented function of its seed, stable across Go releases, platforms
// and processes.
type rng struct{ state uint64 }

const golden = 0x9e3779b97f4a7c15

// newRNG returns the generator for pass number pass of a shuffle seeded
// with seed.
func newRNG(seed, pass uint64) rng {
	return rng{state: mix64(seed) ^ mix64(pass*golden+1)}
}

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *rng) uint64() uint64 {
	r.state += golden
	return mix64(r.state)
}

// intN returns a uniform integer in [0, n), n > 0, without modulo bias
// (rejection sampling on the top of the range).
func (r *rng) intN(n int) int {
	bound := uint64(n)
	limit := -bound % bound // 2^64 mod n
	for {
		v := r.uint64()
		if v >= limit {
			return int(v % bound)
		}
	}
}

// float64 returns a uniform float in [0, 1) with 53 random bits.
func (r *rng) float64() float64 { return float64(r.uint64()>>11) / (1 << 53) }
