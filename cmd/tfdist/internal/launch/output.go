package launch

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"sync"
)

// syncWriters serialises the prefixed lines of every task onto the
// launcher's stdout and stderr, so that lines never interleave mid-line.
type syncWriters struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
}

// maxLine is the longest piece written at once; a longer line is written in
// pieces, the prefix only before the first.
const maxLine = 64 << 10

// pump copies r to stdout (or stderr) line by line, each line prefixed, until
// r ends, and keeps the start of each line in tail. A last line without a
// newline gets one.
func (s *syncWriters) pump(r io.Reader, toStderr bool, prefix string, tail *tail) {
	w := s.stdout
	if toStderr {
		w = s.stderr
	}
	br := bufio.NewReaderSize(r, maxLine)
	atStart := true
	buf := make([]byte, 0, 256)
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			buf = buf[:0]
			if atStart {
				buf = append(buf, prefix...)
				tail.add(chunk, toStderr)
			}
			buf = append(buf, chunk...)
			atStart = chunk[len(chunk)-1] == '\n'
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) && !atStart {
				buf = append(buf, '\n')
				atStart = true
			}
			s.mu.Lock()
			_, _ = w.Write(buf)
			s.mu.Unlock()
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// Bounds of what a tail keeps.
const (
	tailLines   = 10  // the last lines of each stream of a process
	tailLineMax = 300 // bytes kept of each
)

// tail keeps the last lines one process wrote to each of stdout and stderr,
// for the error that reports its exit: so many of each that a burst on one
// stream cannot push the other's last words out.
type tail struct {
	mu      sync.Mutex
	streams [2][]tailLine // stdout's and stderr's last lines, oldest first
	seq     int           // lines read so far
}

type tailLine struct {
	seq  int
	text string
}

// add keeps a line of stdout (or stderr), without its line ending, cut to
// tailLineMax bytes.
func (t *tail) add(line []byte, stderr bool) {
	line = bytes.TrimRight(line, "\r\n")
	if len(line) > tailLineMax {
		line = append(line[:tailLineMax:tailLineMax], "…"...)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := boolInt(stderr)
	kept := append(t.streams[s], tailLine{seq: t.seq, text: string(line)})
	t.streams[s] = kept[max(0, len(kept)-tailLines):]
	t.seq++
}

// last returns the lines kept of both streams, merged in the order they
// were read.
func (t *tail) last() []string {
	t.mu.Lock()
	lines := slices.Concat(t.streams[0], t.streams[1])
	t.mu.Unlock()
	slices.SortFunc(lines, func(a, b tailLine) int { return a.seq - b.seq })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return out
}
