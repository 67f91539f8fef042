package soak

import (
	"bytes"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"sync"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/classifier"
)

// tailLines is how many of the last output lines a report keeps.
const tailLines = 40

// lineWriter splits the launcher's prefixed output ("[worker:1] text")
// into lines, hands each to fn with its task, copies it to out, and keeps
// the last lines.
type lineWriter struct {
	out io.Writer
	fn  func(cluster.Task, string)

	mu   sync.Mutex
	buf  []byte
	last []string
}

func newLineWriter(out io.Writer, fn func(cluster.Task, string)) *lineWriter {
	if out == nil {
		out = io.Discard
	}
	return &lineWriter{out: out, fn: fn}
}

var prefixed = regexp.MustCompile(`^\[(\w+):(\d+)\] (.*)$`)

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.out.Write(p)
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		l.last = append(l.last, line)
		if len(l.last) > tailLines {
			l.last = l.last[1:]
		}
		if m := prefixed.FindStringSubmatch(line); m != nil {
			idx, _ := strconv.Atoi(m[2])
			l.fn(cluster.Task{Type: cluster.TaskType(m[1]), Index: idx}, m[3])
		}
	}
}

func (l *lineWriter) tail() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.last...)
}

var statsLine = regexp.MustCompile(`^stats goroutines=(\d+)(?: heap=(\d+))?$`)

// parseStats reads the classifier's "stats goroutines=N heap=BYTES" line;
// heap is -1 where the line has none.
func parseStats(text string) (goroutines int, heap int64, ok bool) {
	m := statsLine.FindStringSubmatch(text)
	if m == nil {
		return 0, 0, false
	}
	goroutines, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, 0, false
	}
	heap = -1
	if m[2] != "" {
		heap, _ = strconv.ParseInt(m[2], 10, 64)
	}
	return goroutines, heap, true
}

// resultLine is the classifier's -json result and the task that printed it.
type resultLine struct {
	Task cluster.Task
	classifier.Result
}

// parseResult reads the -json line of a task that trained (the chief's, or
// any synchronous worker's).
func parseResult(task cluster.Task, text string) (*resultLine, bool) {
	if len(text) == 0 || text[0] != '{' {
		return nil, false
	}
	var r classifier.Result
	if err := json.Unmarshal([]byte(text), &r); err != nil || r.Strategy == "" {
		return nil, false
	}
	return &resultLine{Task: task, Result: r}, true
}
