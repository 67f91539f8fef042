package straggler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/straggler"
)

const ms = time.Millisecond

// The fastest worker scores 1, one twice as slow 0.5, and the slow phase
// is where a worker exceeds the fastest most.
func TestScores(t *testing.T) {
	s := straggler.Scores([]straggler.Window{
		{Input: 1 * ms, Compute: 9 * ms},
		{Input: 11 * ms, Compute: 9 * ms},
		{Input: 1 * ms, Compute: 14 * ms},
	})
	require.Len(t, s, 3)
	assert.InDelta(t, 1.0, s[0].Relative, 1e-9)
	assert.InDelta(t, 0.5, s[1].Relative, 1e-9)
	assert.Equal(t, "input", s[1].Phase)
	assert.InDelta(t, 10.0/15, s[2].Relative, 1e-9)
	assert.Equal(t, "compute", s[2].Phase)
	assert.Empty(t, straggler.Scores(nil))
}

// A worker is named only once it has been slow for Patience windows in a
// row; a window at speed resets its count, and a job without one names
// nobody.
func TestDetectorNeedsAPersistentStraggler(t *testing.T) {
	even := []straggler.Window{{Compute: 10 * ms}, {Compute: 10 * ms}}
	slow := []straggler.Window{{Compute: 10 * ms}, {Input: 10 * ms, Compute: 10 * ms}}
	d := &straggler.Detector{}
	assert.Empty(t, d.Observe(slow))
	assert.Empty(t, d.Observe(slow))
	assert.Empty(t, d.Observe(even), "a window at speed resets the count")
	assert.Empty(t, d.Observe(slow))
	assert.Empty(t, d.Observe(slow))
	got := d.Observe(slow)
	require.Len(t, got, 1)
	assert.Equal(t, 1, got[0].Worker)
	assert.Equal(t, "input", got[0].Phase)
	assert.Equal(t, 3, got[0].Windows)
	assert.Contains(t, got[0].String(), "worker 1 is a straggler: 0.50 of the fastest worker's speed for 3 windows, slow in input")
	for range 10 {
		assert.Empty(t, (&straggler.Detector{}).Observe(even))
	}
}
