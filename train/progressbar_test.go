package train_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/train"
)

// fakeClock is a clock that a callback advances by step at each batch's
// end, so that every batch takes step.
type fakeClock struct {
	now  time.Time
	step time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) callback() train.Callback {
	return &train.LambdaCallback{BatchEnd: func(context.Context, *train.Run, int, train.Logs) error {
		c.now = c.now.Add(c.step)
		return nil
	}}
}

// timedWriter records the clock's time at each write.
type timedWriter struct {
	buf   bytes.Buffer
	clock *fakeClock
	at    []time.Time
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.at = append(w.at, w.clock.now)
	return w.buf.Write(p)
}

// logsText is how the bar prints logs: in key order, 4 decimals.
func logsText(h *train.History, epoch int) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(h.Values)) {
		fmt.Fprintf(&b, " - %s: %.4f", k, h.Values[k][epoch])
	}
	return b.String()
}

// Where the output is not a terminal, ProgressBar prints Keras's
// verbose=2: "Epoch n/N", then one line per epoch with its steps, its
// time, its time per step and every log, validation included, and no
// carriage return.
func TestProgressBarPlainLines(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	clock := &fakeClock{now: time.Unix(1e9, 0), step: 40 * time.Millisecond}
	var out bytes.Buffer
	bar := train.NewProgressBar(&out, train.ProgressTerminal(false), train.ProgressClock(clock.Now))
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.ValidationData(val), train.WithCallbacks(clock.callback(), bar))
	require.NoError(t, err)
	want := "Epoch 1/2\n3/3 - 120ms - 40ms/step" + logsText(h, 0) + "\n" +
		"Epoch 2/2\n3/3 - 120ms - 40ms/step" + logsText(h, 1) + "\n"
	assert.Equal(t, want, out.String())
	assert.NotContains(t, out.String(), "\r")
}

// On a terminal ProgressBar redraws one line per epoch, never twice
// within the refresh time (here 100ms, at 30ms a batch), with the step,
// the total — "Unknown" in the first epoch of a pass over the data, the
// first epoch's steps after it — the ETA and the logs so far, and ends
// each epoch with its full bar, time and logs.
func TestProgressBarTerminalRedraws(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	d, _ := digitsData(t)
	ds := dataset.Batched(sliceDS(t, d, 100), 10, false)
	clock := &fakeClock{now: time.Unix(1e9, 0), step: 30 * time.Millisecond}
	out := &timedWriter{clock: clock}
	bar := train.NewProgressBar(out, train.ProgressTerminal(true), train.ProgressClock(clock.Now))
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.WithCallbacks(clock.callback(), bar))
	require.NoError(t, err)

	epochs := strings.SplitAfter(strings.TrimSuffix(out.buf.String(), "\n"), "\n")
	require.Len(t, epochs, 4, "%q", out.buf.String())
	w := 0 // the write being read
	for e := range 2 {
		require.Equal(t, fmt.Sprintf("Epoch %d/2\n", e+1), epochs[2*e])
		w++
		lines := strings.Split(strings.TrimSuffix(epochs[2*e+1], "\n"), "\r")[1:]
		redraws, final := lines[:len(lines)-1], lines[len(lines)-1]
		assert.Less(t, len(redraws), 10, "fewer redraws than batches")
		var last time.Time
		for i, line := range redraws {
			if i > 0 {
				assert.GreaterOrEqual(t, out.at[w].Sub(last), 100*time.Millisecond, "redraw %d of epoch %d", i, e)
			}
			last = out.at[w]
			w++
			if e == 0 {
				assert.Regexp(t, `^\d+/Unknown \d+ms 30ms/step - accuracy: \d\.\d{4} - loss: \d\.\d{4} *$`, line)
			} else {
				assert.Regexp(t, `^ ?\d+/10 \[=*>\.*\] ETA: \d+ms - 30ms/step - accuracy: \d\.\d{4} - loss: \d\.\d{4} *$`, line)
			}
		}
		assert.Equal(t, "10/10 ["+strings.Repeat("=", 30)+"] 300ms 30ms/step"+logsText(h, e), strings.TrimRight(final, " "))
		w++
	}
	assert.Len(t, out.at, w, "every write read")
}
