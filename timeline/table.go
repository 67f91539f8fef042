package timeline

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// Breakdowns reads a trace that Write or Merge wrote and returns each
// task's breakdown, by the task's name.
func Breakdowns(r io.Reader) (map[string]Breakdown, error) {
	var t trace
	if err := json.NewDecoder(r).Decode(&t); err != nil {
		return nil, fmt.Errorf("timeline: read a trace: %w", err)
	}
	return breakdowns(t.TraceEvents), nil
}

// breakdowns summarizes the complete events of each process, named by its
// process_name event.
func breakdowns(events []event) map[string]Breakdown {
	names := map[int]string{}
	spans := map[int][]Span{}
	for _, e := range events {
		switch e.Ph {
		case "M":
			args, _ := e.Args.(map[string]any)
			if n, ok := args["name"].(string); ok && e.Name == "process_name" {
				names[e.PID] = n
			}
		case "X":
			start := time.UnixMicro(0).Add(time.Duration(e.TS * 1e3))
			spans[e.PID] = append(spans[e.PID], Span{Phase: Phase(e.Cat), Start: start, End: start.Add(time.Duration(e.Dur * 1e3))})
		}
	}
	out := map[string]Breakdown{}
	for pid, ss := range spans {
		name, ok := names[pid]
		if !ok {
			name = fmt.Sprintf("process %d", pid)
		}
		out[name] = Summarize(ss)
	}
	return out
}

// WriteTable writes breakdowns as a table, a row per task in the order of
// their names: each phase's share of the task's wall time, the share no
// span covers, and the share of communication that compute overlapped.
func WriteTable(w io.Writer, bs map[string]Breakdown) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\twall\tinput\tcompute\tcommunication\twaiting for peers\tcheckpoint\tidle\toverlapped\t")
	pct := func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }
	tasks := make([]string, 0, len(bs))
	for t := range bs {
		tasks = append(tasks, t)
	}
	slices.Sort(tasks)
	for _, t := range tasks {
		b := bs[t]
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t, b.Wall.Round(time.Millisecond),
			pct(b.Share[Input]), pct(b.Share[Compute]), pct(b.Share[Collective]), pct(b.Share[Wait]),
			pct(b.Share[Checkpoint]), pct(b.Idle), pct(b.Overlapped))
	}
	return tw.Flush()
}
