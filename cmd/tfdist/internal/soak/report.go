package soak

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/classifier"
)

// Sample is what one look at a process saw.
type Sample struct {
	At         time.Duration // since the run started
	Threads    int
	RSS        int64 // bytes
	FDs        int
	Goroutines int   // -1 where the process has not reported them
	GoHeap     int64 // bytes of the Go heap (shown, not bounded); -1 if not reported
}

// Process is one process of a run and its samples.
type Process struct {
	Task    cluster.Task
	Attempt int
	PID     int
	Samples []Sample

	goroutines int   // the newest count the process reported
	heap       int64 // and its newest Go heap size
	gone       bool  // exited
}

// Report is the outcome of one soak run.
type Report struct {
	Setup      string
	Steps      int
	Elapsed    time.Duration
	Err        error // the launcher's: a task failed, or the timeout passed
	Processes  []*Process
	Result     *resultLine // the chief's -json result, nil if none came
	Tail       []string    // the last lines of output
	Violations []string    // every bound a process broke

	transient bool // processes come and go (Setup.ScaleEvery)
}

// Failed reports whether the run failed or broke a bound.
func (r *Report) Failed() bool { return r.Err != nil || r.Result == nil || len(r.Violations) > 0 }

// minSamples is how many samples a process needs to be judged.
const minSamples = 5

// judge checks every process against b.
func (r *Report) judge(b Bounds) {
	if len(r.Processes) == 0 {
		r.Violations = append(r.Violations, "no process was started")
	}
	longest := 0
	for _, p := range r.Processes {
		longest = max(longest, len(p.Samples))
	}
	for _, p := range r.Processes {
		if r.transient && len(p.Samples) < longest/2 {
			continue // a worker that joined or left in passing
		}
		for _, v := range p.violations(b) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s (pid %d): %s", p.Task, p.PID, v))
		}
	}
	// An elastic job's last membership may be short, and the steps after a
	// change slower: the ratio says nothing there.
	if st := r.stepTimes(); st != nil && !r.transient && b.MaxStepRatio > 0 && st.MaxMS > b.MaxStepRatio*st.MedianMS {
		r.Violations = append(r.Violations, fmt.Sprintf("%s: the slowest of %d steps took %.1f ms, %.1f times the median step's %.2f ms, expected at most %g times",
			r.Result.Task, st.Steps, st.MaxMS, st.MaxMS/st.MedianMS, st.MedianMS, b.MaxStepRatio))
	}
}

// stepTimes returns the step times of the task that reported the result,
// nil where it reported none.
func (r *Report) stepTimes() *classifier.StepTimes {
	if r.Result == nil {
		return nil
	}
	return r.Result.StepTimes
}

// figures are what a process is judged on. Open files and goroutines
// come and go (a connection being dialled, a goroutine finishing), so
// their growth compares the fewest seen over a window: the tenth of the run
// after its first tenth, and its last tenth. A leak raises that floor; a
// passing connection does not.
type figures struct {
	tenth, end        Sample // at a tenth of the sampled life, and the last sample
	fdsEarly, fdsLate int
	grEarly, grLate   int // -1 where the process did not report goroutines
}

func (p *Process) figures() figures {
	first, last := p.Samples[0].At, p.Samples[len(p.Samples)-1].At
	d := (last - first) / 10
	f := figures{tenth: p.Samples[len(p.Samples)-1], end: p.Samples[len(p.Samples)-1]}
	for _, s := range p.Samples {
		if s.At >= first+d {
			f.tenth = s
			break
		}
	}
	f.fdsEarly, f.grEarly = floors(p.Samples, first+d, first+2*d, f.tenth)
	f.fdsLate, f.grLate = floors(p.Samples, last-d, last, f.end)
	return f
}

// floors returns the fewest open files and goroutines among the samples
// taken from..to, or those of fallback when none was.
func floors(samples []Sample, from, to time.Duration, fallback Sample) (fds, goroutines int) {
	fds, goroutines = -1, -1
	for _, s := range samples {
		if s.At < from || s.At > to {
			continue
		}
		if fds < 0 || s.FDs < fds {
			fds = s.FDs
		}
		if s.Goroutines >= 0 && (goroutines < 0 || s.Goroutines < goroutines) {
			goroutines = s.Goroutines
		}
	}
	if fds < 0 {
		fds = fallback.FDs
	}
	if goroutines < 0 {
		goroutines = fallback.Goroutines
	}
	return fds, goroutines
}

// MaxThreads returns the most OS threads any sample saw.
func (p *Process) MaxThreads() int {
	n := 0
	for _, s := range p.Samples {
		n = max(n, s.Threads)
	}
	return n
}

func (p *Process) violations(b Bounds) []string {
	if len(p.Samples) < minSamples {
		return []string{fmt.Sprintf("%d samples: too few to judge (at least %d; a longer run, or a shorter interval)", len(p.Samples), minSamples)}
	}
	var out []string
	if n := p.MaxThreads(); n > b.MaxThreads {
		out = append(out, fmt.Sprintf("%d OS threads, expected at most %d", n, b.MaxThreads))
	}
	f := p.figures()
	t, end := f.tenth, f.end
	if float64(end.RSS) > float64(t.RSS)*(1+b.MaxRSSGrowth) {
		out = append(out, fmt.Sprintf("resident memory grew from %s at %v to %s at %v (+%.1f%%), expected at most +%.0f%%",
			mib(t.RSS), t.At.Round(time.Second), mib(end.RSS), end.At.Round(time.Second),
			100*(float64(end.RSS)/float64(t.RSS)-1), 100*b.MaxRSSGrowth))
	}
	if f.fdsLate > f.fdsEarly+b.MaxFDGrowth {
		out = append(out, fmt.Sprintf("open file descriptors grew from %d to %d (the fewest early and late in the run), expected at most +%d",
			f.fdsEarly, f.fdsLate, b.MaxFDGrowth))
	}
	if f.grEarly >= 0 && f.grLate > f.grEarly+b.MaxGoroutineGrowth {
		out = append(out, fmt.Sprintf("goroutines grew from %d to %d (the fewest early and late in the run), expected at most +%d",
			f.grEarly, f.grLate, b.MaxGoroutineGrowth))
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// WriteTable writes r as a table: one row per process with its figures at a
// tenth of the run and at the end (open files and goroutines: the fewest
// early and late in the run), then the verdict.
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%s: %d steps in %v", r.Setup, r.Steps, r.Elapsed.Round(time.Second))
	if r.Result != nil && r.Result.GlobalBatch > 0 {
		fmt.Fprintf(w, " (%.0f steps/s, final loss %.4f, accuracy %.2f%%)",
			r.Result.ExamplesPerSec/float64(r.Result.GlobalBatch), r.Result.FinalLoss, 100*r.Result.Accuracy)
	}
	fmt.Fprintln(w)
	if st := r.stepTimes(); st != nil {
		fmt.Fprintf(w, "steps of %s after %d warm-up: median %.2f ms, 99%% %.2f ms, 99.9%% %.2f ms, slowest %.1f ms (%.1f times the median)\n",
			r.Result.Task, st.Warmup, st.MedianMS, st.P99MS, st.P999MS, st.MaxMS, st.MaxMS/st.MedianMS)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\tpid\tsamples\tthreads max\tRSS 1/10\tRSS end\tRSS growth\tfds 1/10\tfds end\tgoroutines 1/10\tgoroutines end\tGo heap 1/10\tGo heap end\t")
	for _, p := range r.Processes {
		if len(p.Samples) == 0 {
			fmt.Fprintf(tw, "%s\t%d\t0\t\t\t\t\t\t\t\t\t\t\t\n", p.Task, p.PID)
			continue
		}
		f := p.figures()
		t, end := f.tenth, f.end
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%+.1f%%\t%d\t%d\t%s\t%s\t%s\t%s\t\n", p.Task, p.PID, len(p.Samples), p.MaxThreads(),
			mib(t.RSS), mib(end.RSS), 100*(float64(end.RSS)/float64(max(t.RSS, 1))-1), f.fdsEarly, f.fdsLate,
			count(f.grEarly), count(f.grLate), heapMiB(t.GoHeap), heapMiB(end.GoHeap))
	}
	tw.Flush()
	switch {
	case r.Err != nil:
		fmt.Fprintf(w, "FAIL: %v\nlast output:\n  %s\n", r.Err, strings.Join(r.Tail, "\n  "))
	case r.Result == nil:
		fmt.Fprintf(w, "FAIL: no task printed its result\nlast output:\n  %s\n", strings.Join(r.Tail, "\n  "))
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "FAIL: %s\n", v)
	}
	if !r.Failed() {
		fmt.Fprintln(w, "ok: every process exited as expected and stayed within its bounds")
	}
}

func count(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func heapMiB(b int64) string {
	if b < 0 {
		return "-"
	}
	return mib(b)
}
