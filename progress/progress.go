package progress

import (
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultRefresh is the shortest time between two redraws of the status line
// on a terminal, unless told otherwise.
const DefaultRefresh = 100 * time.Millisecond

// window is how many recent updates the rate is measured over.
const window = 32

// Option configures a [Reporter].
type Option func(*Reporter)

// WithEvery sets how often, in steps, a plain line is printed when the output
// is not a terminal, and how often WithLogger logs (default: a tenth of the
// total steps, or every 100 steps when the total is unknown).
func WithEvery(steps int) Option {
	return func(r *Reporter) {
		if steps > 0 {
			r.every = steps
		}
	}
}

// WithRefresh sets the shortest time between two redraws of the terminal
// line (default [DefaultRefresh]).
func WithRefresh(d time.Duration) Option {
	return func(r *Reporter) {
		if d >= 0 {
			r.refresh = d
		}
	}
}

// WithTerminal forces the terminal (redrawn line) or plain (one line every
// few steps) mode rather than detecting it from the writer.
func WithTerminal(on bool) Option {
	return func(r *Reporter) { r.term = on; r.termSet = true }
}

// WithPrefix starts every line with prefix, to tell several reporters apart
// ("worker 1: ", say).
func WithPrefix(prefix string) Option {
	return func(r *Reporter) { r.prefix = prefix }
}

// WithMetric adds name's value at the step shown to every line, after the
// loss (the privacy spent so far, say): "  ε 1.23".
func WithMetric(name string, value func(step int) float64) Option {
	return func(r *Reporter) { r.metrics = append(r.metrics, metric{name, value}) }
}

// metric is a value WithMetric adds to the lines.
type metric struct {
	name  string
	value func(step int) float64
}

// WithInitialStep sets the step the run starts from (default 0), as when it
// resumes from a checkpoint: the rate counts only the steps run since.
func WithInitialStep(step int) Option {
	return func(r *Reporter) { r.initial = step }
}

// WithLogger also logs the progress through l at info level, with the fields
// step, total_steps, loss, examples_per_sec and eta, every WithEvery steps and
// on Close ("training progress", then "training done"). Give it a logger
// tagged with the task (logging.ForTask) so each worker's lines say whose
// they are. A nil logger logs nothing.
func WithLogger(l *zap.Logger) Option {
	return func(r *Reporter) { r.log = l }
}

// WithClock sets the clock the Reporter measures time with (default
// time.Now); tests use it to get deterministic rates.
func WithClock(now func() time.Time) Option {
	return func(r *Reporter) {
		if now != nil {
			r.now = now
		}
	}
}

// Stats is a snapshot of a run's progress.
type Stats struct {
	// Step is the number of steps completed (the last Update's step).
	Step int
	// Total is the number of steps of the run; 0 if unknown.
	Total int
	// Loss is the last loss reported; NaN before the first Update.
	Loss float64
	// ExamplesPerSec is the recent rate: steps × global batch per second
	// over the last updates; 0 before the first update.
	ExamplesPerSec float64
	// Elapsed is the time since the Reporter was created.
	Elapsed time.Duration
	// ETA is the estimated time to the last step; 0 when the total is
	// unknown or reached, or the rate not yet known.
	ETA time.Duration
}

type sample struct {
	t    time.Time
	step int
}

// Reporter shows the progress of a training loop. Create it with [New].
type Reporter struct {
	w       io.Writer
	total   int
	batch   int
	term    bool
	termSet bool
	every   int
	refresh time.Duration
	prefix  string
	initial int
	log     *zap.Logger
	now     func() time.Time
	metrics []metric

	mu       sync.Mutex
	start    time.Time
	samples  [window]sample // ring of recent updates
	next     int            // where the next sample goes
	n        int            // samples held
	step     int
	loss     float64
	updated  bool
	lastDraw time.Time
	lastLen  int // length of the last terminal line, to blank its leftovers
	closed   bool
	err      error
}

// New returns a Reporter of a run of totalSteps steps (0 if unknown) of
// globalBatch examples each, writing to w. Unless WithTerminal says
// otherwise, it redraws one line when w is a terminal and prints plain lines
// otherwise.
func New(w io.Writer, totalSteps, globalBatch int, opts ...Option) *Reporter {
	r := &Reporter{w: w, total: max(totalSteps, 0), batch: max(globalBatch, 0), refresh: DefaultRefresh, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	if !r.termSet {
		r.term = IsTerminal(w)
	}
	if r.every == 0 {
		r.every = 100
		if r.total > 0 {
			r.every = max(r.total/10, 1)
		}
	}
	r.start = r.now()
	r.push(sample{r.start, r.initial})
	r.step = r.initial
	return r
}

// Terminal reports whether the Reporter redraws one line (true) or prints
// plain lines (false).
func (r *Reporter) Terminal() bool { return r.term }

// Update records that step steps are complete and the last one's loss. It
// redraws the terminal line (at most every WithRefresh, and at the last
// step) or prints a plain line (every WithEvery steps; Close prints the
// last). It never blocks on anything but the writer; write errors are
// returned by Close.
func (r *Reporter) Update(step int, loss float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	now := r.now()
	r.step, r.loss, r.updated = step, loss, true
	r.push(sample{now, step})
	last := r.total > 0 && step >= r.total
	due := step%r.every == 0 && !last // Close prints and logs the last step
	if r.term {
		if now.Sub(r.lastDraw) >= r.refresh || last {
			r.draw(now)
		}
	} else if due {
		r.println(r.line(now, false))
	}
	if due && r.log != nil {
		r.logStats("training progress", r.stats(now))
	}
}

// Stats returns the current progress.
func (r *Reporter) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats(r.now())
}

// Close prints the final line — the last step, loss and rate and the elapsed
// time — ending the redrawn line on a terminal, and logs "training done". It
// returns the first error writing to the writer, if any. Later Updates are
// ignored; closing again returns nil.
func (r *Reporter) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	now := r.now()
	if r.term {
		r.write("\r" + r.pad(r.line(now, true)) + "\n")
	} else {
		r.println(r.line(now, true))
	}
	if r.log != nil {
		r.logStats("training done", r.stats(now))
	}
	return r.err
}

func (r *Reporter) push(s sample) {
	r.samples[r.next] = s
	r.next = (r.next + 1) % window
	r.n = min(r.n+1, window)
}

func (r *Reporter) stats(now time.Time) Stats {
	st := Stats{Step: r.step, Total: r.total, Loss: r.loss, Elapsed: now.Sub(r.start)}
	oldest := r.samples[(r.next-r.n+window)%window]
	if dt := now.Sub(oldest.t).Seconds(); dt > 0 && r.step > oldest.step {
		stepsPerSec := float64(r.step-oldest.step) / dt
		st.ExamplesPerSec = stepsPerSec * float64(r.batch)
		if r.total > r.step {
			st.ETA = time.Duration(float64(r.total-r.step) / stepsPerSec * float64(time.Second))
		}
	}
	if !r.updated {
		st.Loss = math.NaN()
	}
	return st
}

// line formats the status; final replaces the ETA with the elapsed time.
func (r *Reporter) line(now time.Time, final bool) string {
	st := r.stats(now)
	var b strings.Builder
	b.WriteString(r.prefix)
	width := 1
	if r.total > 0 {
		width = len(fmt.Sprint(r.total))
	}
	if r.total > 0 {
		fmt.Fprintf(&b, "step %*d/%d", width, st.Step, r.total)
		if r.term {
			frac := math.Min(float64(st.Step)/float64(r.total), 1)
			fmt.Fprintf(&b, " %s %3.0f%%", bar(frac, 20), 100*frac)
		}
	} else {
		fmt.Fprintf(&b, "step %d", st.Step)
	}
	if r.updated {
		fmt.Fprintf(&b, "  loss %.4f", st.Loss)
	}
	for _, m := range r.metrics {
		fmt.Fprintf(&b, "  %s %.3g", m.name, m.value(st.Step))
	}
	if st.ExamplesPerSec > 0 {
		fmt.Fprintf(&b, "  %.0f examples/s", st.ExamplesPerSec)
	}
	switch {
	case final:
		fmt.Fprintf(&b, "  elapsed %s", FormatDuration(st.Elapsed))
	case st.ETA > 0:
		fmt.Fprintf(&b, "  ETA %s", FormatDuration(st.ETA))
	}
	return b.String()
}

func (r *Reporter) draw(now time.Time) {
	r.write("\r" + r.pad(r.line(now, false)))
	r.lastDraw = now
}

// pad blanks what remains of a longer previous line.
func (r *Reporter) pad(s string) string {
	n := len(s)
	if n < r.lastLen {
		s += strings.Repeat(" ", r.lastLen-n)
	}
	r.lastLen = n
	return s
}

func (r *Reporter) println(s string) { r.write(s + "\n") }

func (r *Reporter) write(s string) {
	if r.err != nil {
		return
	}
	if _, err := io.WriteString(r.w, s); err != nil {
		r.err = fmt.Errorf("progress: write: %w", err)
	}
}

func (r *Reporter) logStats(msg string, st Stats) {
	r.log.Info(msg,
		zap.Int("step", st.Step),
		zap.Int("total_steps", st.Total),
		zap.Float64("loss", st.Loss),
		zap.Float64("examples_per_sec", st.ExamplesPerSec),
		zap.Duration("eta", st.ETA),
		zap.Duration("elapsed", st.Elapsed))
}

func bar(frac float64, width int) string {
	full := int(frac * float64(width))
	var b strings.Builder
	b.WriteByte('[')
	for i := range width {
		switch {
		case i < full:
			b.WriteByte('=')
		case i == full && full < width:
			b.WriteByte('>')
		default:
			b.WriteByte(' ')
		}
	}
	b.WriteByte(']')
	return b.String()
}

// FormatDuration formats d compactly for a status line: "850ms", "12s",
// "3m05s", "1h02m03s".
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", math.Floor(d.Seconds()))
	case d < time.Hour:
		d = d.Truncate(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	d = d.Truncate(time.Second)
	return fmt.Sprintf("%dh%02dm%02ds", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
}
