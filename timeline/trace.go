package timeline

import (
	"encoding/json"
	"fmt"
	"io"
)

// event is one Chrome trace event: a complete span ("X") or a name of a
// process or thread ("M").
type event struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat,omitempty"`
	Ph   string  `json:"ph"`
	TS   float64 `json:"ts"`  // microseconds since the Unix epoch
	Dur  float64 `json:"dur"` // a complete event without one never ends, to viewers
	PID  int     `json:"pid"`
	TID  int     `json:"tid"`
	Args any     `json:"args,omitempty"`
}

// trace is a Chrome trace file (the JSON object form).
type trace struct {
	TraceEvents     []event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	OtherData       map[string]any `json:"otherData,omitempty"`
}

// Write writes r's spans as a Chrome trace of one process, named task,
// with process id pid and a thread per lane. Times are whole microseconds
// since the Unix epoch, so that the traces of tasks on one host share a
// clock.
func Write(w io.Writer, r *Recorder, task string, pid int) error {
	spans, dropped := r.Spans()
	t := trace{DisplayTimeUnit: "ms", OtherData: map[string]any{"dropped_spans": map[string]int64{task: dropped}}}
	t.TraceEvents = append(t.TraceEvents, event{Name: "process_name", Ph: "M", PID: pid, Args: map[string]any{"name": task}})
	lanes := map[int]bool{}
	for _, s := range spans {
		// Whole microseconds, exact in a float64, so that a span inside
		// another ends inside it on the trace too.
		start, end := s.Start.UnixMicro(), s.End.UnixMicro()
		t.TraceEvents = append(t.TraceEvents, event{
			Name: s.Name, Cat: string(s.Phase), Ph: "X", PID: pid, TID: s.Lane, Args: s.Args,
			TS: float64(start), Dur: float64(end - start),
		})
		lanes[s.Lane] = true
	}
	for lane := range lanes {
		t.TraceEvents = append(t.TraceEvents,
			event{Name: "thread_name", Ph: "M", PID: pid, TID: lane, Args: map[string]any{"name": laneName(lane)}},
			event{Name: "thread_sort_index", Ph: "M", PID: pid, TID: lane, Args: map[string]any{"sort_index": lane}})
	}
	if err := json.NewEncoder(w).Encode(t); err != nil {
		return fmt.Errorf("timeline: write the trace of %s: %w", task, err)
	}
	return nil
}

// laneName names a lane's track: the steps, then the collectives that
// overlap them.
func laneName(lane int) string {
	if lane == 0 {
		return "steps"
	}
	return fmt.Sprintf("collectives %d", lane)
}

// Merge reads the traces Write wrote, one per task, and writes them as one
// trace with one track per task, in the order given: the i-th trace's
// events get process id i.
func Merge(w io.Writer, traces ...io.Reader) error {
	out := trace{DisplayTimeUnit: "ms", OtherData: map[string]any{}}
	dropped := map[string]int64{}
	for i, r := range traces {
		var t trace
		if err := json.NewDecoder(r).Decode(&t); err != nil {
			return fmt.Errorf("timeline: merge: trace %d: %w", i, err)
		}
		for _, e := range t.TraceEvents {
			e.PID = i
			out.TraceEvents = append(out.TraceEvents, e)
		}
		if d, ok := t.OtherData["dropped_spans"].(map[string]any); ok {
			for task, n := range d {
				if f, ok := n.(float64); ok {
					dropped[task] = int64(f)
				}
			}
		}
	}
	out.OtherData["dropped_spans"] = dropped
	out.OtherData["breakdown"] = breakdowns(out.TraceEvents)
	if err := json.NewEncoder(w).Encode(out); err != nil {
		return fmt.Errorf("timeline: merge: %w", err)
	}
	return nil
}
