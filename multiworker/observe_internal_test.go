package multiworker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/tfdist/tfdist/dataset"
)

// A loop that never compares its workers keeps a bounded window of its
// steps, however long it runs, and the window's medians are its recent
// steps'.
func TestStragglerWindowIsBounded(t *testing.T) {
	o, err := newObserver(config{}, "worker:0")
	assert.NoError(t, err)
	begin := time.Now()
	for i := range 3 * maxWindow {
		d := time.Millisecond
		if i >= 2*maxWindow {
			d = 3 * time.Millisecond
		}
		o.step(&dataset.Batch{}, begin, begin.Add(d), 0, true)
		begin = begin.Add(d)
		assert.LessOrEqual(t, len(o.computes), maxWindow)
	}
	assert.Equal(t, 3*time.Millisecond, o.window().Compute, "the recent steps' median")
	assert.Empty(t, o.computes, "a window starts the next")
}
