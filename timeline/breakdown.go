package timeline

import (
	"slices"
	"time"
)

// Breakdown splits the wall time of a window of spans (from the first
// span's start to the last span's end) into its phases.
type Breakdown struct {
	Wall time.Duration `json:"wall_ns"`
	// Share is each phase's share of Wall: the union of its spans, so that
	// overlapping spans of one phase count once. Shares of different
	// phases overlap where the phases do (a collective during backprop).
	Share map[Phase]float64 `json:"share"`
	// Idle is the share of Wall that no span covers but a whole step's.
	Idle float64 `json:"idle"`
	// Overlapped is the share of collective time that compute time
	// covered: communication hidden behind computation.
	Overlapped float64 `json:"overlapped"`
}

// Summarize returns the breakdown of spans.
func Summarize(spans []Span) Breakdown {
	b := Breakdown{Share: map[Phase]float64{}}
	if len(spans) == 0 {
		return b
	}
	byPhase := map[Phase][]interval{}
	var all []interval
	first, last := spans[0].Start, spans[0].End
	for _, s := range spans {
		iv := interval{s.Start, s.End}
		byPhase[s.Phase] = append(byPhase[s.Phase], iv)
		if s.Phase != Step {
			all = append(all, iv)
		}
		if s.Start.Before(first) {
			first = s.Start
		}
		if s.End.After(last) {
			last = s.End
		}
	}
	b.Wall = last.Sub(first)
	if b.Wall <= 0 {
		return b
	}
	for p, ivs := range byPhase {
		b.Share[p] = float64(length(union(ivs))) / float64(b.Wall)
	}
	b.Idle = 1 - float64(length(union(all)))/float64(b.Wall)
	comm := union(byPhase[Collective])
	if n := length(comm); n > 0 {
		b.Overlapped = float64(length(intersect(comm, union(byPhase[Compute])))) / float64(n)
	}
	return b
}

type interval struct{ start, end time.Time }

// union returns ivs' union as sorted, disjoint intervals.
func union(ivs []interval) []interval {
	s := slices.Clone(ivs)
	slices.SortFunc(s, func(a, b interval) int { return a.start.Compare(b.start) })
	var out []interval
	for _, iv := range s {
		if !iv.end.After(iv.start) {
			continue
		}
		if n := len(out); n > 0 && !iv.start.After(out[n-1].end) {
			if iv.end.After(out[n-1].end) {
				out[n-1].end = iv.end
			}
			continue
		}
		out = append(out, iv)
	}
	return out
}

// intersect returns the intersection of two sorted, disjoint lists.
func intersect(a, b []interval) []interval {
	var out []interval
	for i, j := 0, 0; i < len(a) && j < len(b); {
		start, end := later(a[i].start, b[j].start), earlier(a[i].end, b[j].end)
		if end.After(start) {
			out = append(out, interval{start, end})
		}
		if a[i].end.Before(b[j].end) {
			i++
		} else {
			j++
		}
	}
	return out
}

func length(ivs []interval) time.Duration {
	var d time.Duration
	for _, iv := range ivs {
		d += iv.end.Sub(iv.start)
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
