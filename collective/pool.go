package collective

import "sync"

// Payload buffers are pooled in size classes of 4 KiB × 4^i up to
// maxPayload, so receiving a chunk allocates nothing in steady state.
const (
	minClassShift = 12
	classStep     = 2
	numClasses    = 6 // 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB
)

var bufPools [numClasses]sync.Pool

func classOf(n int) int {
	c := 0
	for size := 1 << minClassShift; size < n; size <<= classStep {
		c++
	}
	return c
}

// getBuf returns a pooled buffer of length n (n <= maxPayload).
func getBuf(n int) *[]byte {
	c := classOf(n)
	if b, ok := bufPools[c].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(minClassShift+classStep*c))
	return &b
}

// putBuf returns b to its pool.
func putBuf(b *[]byte) {
	c := classOf(cap(*b))
	if c < numClasses && cap(*b) == 1<<(minClassShift+classStep*c) {
		bufPools[c].Put(b)
	}
}
