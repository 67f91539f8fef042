package train

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tfdist/tfdist/progress"
)

// ProgressBar prints Keras's progress bar: "Epoch 3/10", then each
// epoch's steps, time and logs. On a terminal (Keras's verbose=1) a
// status line is redrawn in place as steps end — at most every
// progress.DefaultRefresh — with the step, the total, a bar, the time
// left and the logs so far:
//
//	Epoch 3/10
//	12/50 [=====>........................] ETA: 2s - 41ms/step - accuracy: 0.8125 - loss: 0.6034
//
// and the epoch ends with the line of its time, its time per step and
// every log, validation included:
//
//	50/50 [==============================] 2s 41ms/step - accuracy: 0.8231 - loss: 0.5891 - val_accuracy: 0.8400 - val_loss: 0.5012
//
// Anywhere else (a file, a pipe; Keras's verbose=2) it prints no carriage
// return: "Epoch 3/10" and one line per epoch:
//
//	50/50 - 2s - 41ms/step - accuracy: 0.8231 - loss: 0.5891 - val_accuracy: 0.8400 - val_loss: 0.5012
//
// Logs are printed in key order with 4 decimals. When StepsPerEpoch is 0
// the first epoch's total is unknown ("12/Unknown"); later epochs take
// the first one's. It writes only on the chief. A write error does not
// stop training: Fit returns it at the end of training.
type ProgressBar struct {
	w       io.Writer
	term    bool
	refresh time.Duration
	now     func() time.Time

	known    int // the steps of an epoch, once an epoch of unknown total ended
	total    int // the current epoch's, 0 when unknown
	steps    int
	start    time.Time
	lastDraw time.Time
	lastLen  int
	err      error
}

// ProgressOption configures a ProgressBar.
type ProgressOption func(*ProgressBar)

// ProgressTerminal forces the redrawn line (true) or the plain lines
// (false) rather than detecting a terminal (progress.IsTerminal).
func ProgressTerminal(on bool) ProgressOption { return func(p *ProgressBar) { p.term = on } }

// ProgressRefresh sets the shortest time between two redraws on a
// terminal (default progress.DefaultRefresh).
func ProgressRefresh(d time.Duration) ProgressOption {
	return func(p *ProgressBar) { p.refresh = max(d, 0) }
}

// ProgressClock sets the clock the bar measures time with (default
// time.Now).
func ProgressClock(now func() time.Time) ProgressOption {
	return func(p *ProgressBar) {
		if now != nil {
			p.now = now
		}
	}
}

// NewProgressBar returns a ProgressBar writing to w.
func NewProgressBar(w io.Writer, opts ...ProgressOption) *ProgressBar {
	p := &ProgressBar{w: w, term: progress.IsTerminal(w), refresh: progress.DefaultRefresh, now: time.Now}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Name names the callback in errors.
func (p *ProgressBar) Name() string { return "ProgressBar" }

// OnTrainBegin implements Callback.
func (p *ProgressBar) OnTrainBegin(context.Context, *Run) error {
	p.known, p.err = 0, nil
	return nil
}

// OnTrainEnd implements Callback: it returns the first write error.
func (p *ProgressBar) OnTrainEnd(context.Context, *Run, Logs) error { return p.err }

// OnEpochBegin implements Callback: it prints "Epoch n/N".
func (p *ProgressBar) OnEpochBegin(_ context.Context, r *Run, epoch int) error {
	if !r.IsChief() {
		return nil
	}
	p.total = r.StepsPerEpoch
	if p.total == 0 {
		p.total = p.known
	}
	p.steps, p.start, p.lastDraw, p.lastLen = 0, p.now(), time.Time{}, 0
	p.write(fmt.Sprintf("Epoch %d/%d\n", epoch+1, r.Epochs))
	return nil
}

// OnBatchBegin implements Callback.
func (p *ProgressBar) OnBatchBegin(context.Context, *Run, int) error { return nil }

// OnBatchEnd implements Callback: on a terminal it redraws the line, if
// the last redraw is old enough.
func (p *ProgressBar) OnBatchEnd(_ context.Context, r *Run, batch int, logs Logs) error {
	if !r.IsChief() {
		return nil
	}
	p.steps = batch + 1
	if !p.term {
		return nil
	}
	now := p.now()
	if !p.lastDraw.IsZero() && now.Sub(p.lastDraw) < p.refresh {
		return nil
	}
	p.lastDraw = now
	p.write("\r" + p.pad(p.line(now, logs, false)))
	return nil
}

// OnEpochEnd implements Callback: it prints the epoch's line.
func (p *ProgressBar) OnEpochEnd(_ context.Context, r *Run, _ int, logs Logs) error {
	if !r.IsChief() {
		return nil
	}
	if r.StepsPerEpoch == 0 && p.known == 0 && !r.Stopping() {
		p.known = p.steps
	}
	line := p.line(p.now(), logs, true)
	if p.term {
		line = "\r" + p.pad(line)
	}
	p.write(line + "\n")
	return nil
}

// line formats the status after p.steps steps; final: the epoch's line.
func (p *ProgressBar) line(now time.Time, logs Logs, final bool) string {
	var b strings.Builder
	elapsed := now.Sub(p.start)
	perStep := elapsed / time.Duration(max(p.steps, 1))
	total := p.total
	if final && total == 0 {
		total = p.steps
	}
	switch {
	case total == 0:
		fmt.Fprintf(&b, "%d/Unknown %s %s", p.steps, progress.FormatDuration(elapsed), formatPerStep(perStep))
	case !p.term:
		fmt.Fprintf(&b, "%d/%d - %s - %s", p.steps, total, progress.FormatDuration(elapsed), formatPerStep(perStep))
	default:
		fmt.Fprintf(&b, "%*d/%d %s ", len(fmt.Sprint(total)), p.steps, total, bar(p.steps, total))
		if final {
			fmt.Fprintf(&b, "%s %s", progress.FormatDuration(elapsed), formatPerStep(perStep))
		} else {
			eta := perStep * time.Duration(max(total-p.steps, 0))
			fmt.Fprintf(&b, "ETA: %s - %s", progress.FormatDuration(eta), formatPerStep(perStep))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(logs)) {
		fmt.Fprintf(&b, " - %s: %s", k, formatLog(logs[k]))
	}
	return b.String()
}

// bar draws Keras's bar of 30 characters.
func bar(done, total int) string {
	const width = 30
	full := min(done*width/total, width)
	s := strings.Repeat("=", full)
	if full < width {
		s += ">" + strings.Repeat(".", width-full-1)
	}
	return "[" + s + "]"
}

// formatLog formats a log value as Keras's progress bar does.
func formatLog(v float64) string {
	if math.Abs(v) > 1e-3 {
		return fmt.Sprintf("%.4f", v)
	}
	return fmt.Sprintf("%.4e", v)
}

// formatPerStep formats the time of a step: "41ms/step", "850us/step",
// "2s/step".
func formatPerStep(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.0fs/step", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%dms/step", d.Milliseconds())
	}
	return fmt.Sprintf("%dus/step", d.Microseconds())
}

// pad blanks what remains of a longer previous line.
func (p *ProgressBar) pad(s string) string {
	n := len(s)
	if n < p.lastLen {
		s += strings.Repeat(" ", p.lastLen-n)
	}
	p.lastLen = n
	return s
}

func (p *ProgressBar) write(s string) {
	if p.err != nil {
		return
	}
	if _, err := io.WriteString(p.w, s); err != nil {
		p.err = fmt.Errorf("write: %w", err)
	}
}
