package classifier

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The summary's quantiles are within the histogram's resolution of the
// exact ones, its slowest step is exact, and warm-up steps stay out of
// them, over spread-out durations.
func TestStepTimesSummary(t *testing.T) {
	var s stepTimes
	s.add(0, time.Hour)
	require.Nil(t, s.summary(), "no step but warm-up, no summary")
	rng := rand.New(rand.NewPCG(1, 2))
	var all []time.Duration
	for range 10_001 {
		d := time.Duration(rng.ExpFloat64() * float64(3*time.Millisecond))
		all = append(all, d)
		s.add(0, d)
	}
	s.add(0, 0)
	all = append(all, 0)
	slices.Sort(all)
	got := s.summary()
	require.NotNil(t, got)
	assert.Equal(t, len(all), got.Steps)
	assert.Equal(t, 1, got.Warmup)
	for q, v := range map[float64]float64{0.5: got.MedianMS, 0.99: got.P99MS, 0.999: got.P999MS} {
		exact := float64(all[int(math.Ceil(q*float64(len(all))))-1]) / float64(time.Millisecond)
		assert.InEpsilon(t, exact, v, 0.011, "quantile %v", q)
	}
	assert.Equal(t, float64(all[len(all)-1])/float64(time.Millisecond), got.MaxMS, "slowest step")
}
