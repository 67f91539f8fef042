package taskserver

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// A body is a sequence of fields: unsigned varints, and strings and byte
// strings as their length (a varint) and bytes. Lists are their length
// and their items; tensors are described in tensor.go.

// encoder writes a body.
type encoder struct {
	buf     bytes.Buffer
	scratch [binary.MaxVarintLen64]byte
}

func (e *encoder) uvarint(v uint64) { e.buf.Write(binary.AppendUvarint(e.scratch[:0], v)) }

func (e *encoder) string(s string) {
	e.uvarint(uint64(len(s)))
	e.buf.WriteString(s)
}

func (e *encoder) bytes(b []byte) {
	e.uvarint(uint64(len(b)))
	e.buf.Write(b)
}

func (e *encoder) strings(ss []string) {
	e.uvarint(uint64(len(ss)))
	for _, s := range ss {
		e.string(s)
	}
}

// decoder reads a body of a known length. Its first error sticks: every
// read after it returns zero values.
type decoder struct {
	body *errReader
	r    *bufio.Reader
	left int64 // bytes of the body not read yet
	err  error
}

// errReader keeps the first error of the reader under it but io.EOF: a
// failure of the connection, not of the body's format.
type errReader struct {
	r   io.Reader
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// newDecoder reads body, of length bytes (-1 if unknown: an error).
func newDecoder(body io.Reader, length int64) *decoder {
	d := &decoder{body: &errReader{r: body}, left: length}
	d.r = readers.Get().(*bufio.Reader)
	d.r.Reset(d.body)
	if length < 0 {
		d.err = errors.New("the body's length is not given")
	}
	return d
}

// release returns the decoder's buffer to the pool.
func (d *decoder) release() {
	d.r.Reset(nil)
	readers.Put(d.r)
	d.r = nil
}

// transportErr returns the error of the connection that failed a read, if
// any.
func (d *decoder) transportErr() error { return d.body.err }

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("malformed body: "+format, args...)
	}
}

// ReadByte reads a byte of the body, for binary.ReadUvarint.
func (d *decoder) ReadByte() (byte, error) {
	if d.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	b, err := d.r.ReadByte()
	if err == nil {
		d.left--
	}
	return b, err
}

// full reads len(p) bytes of the body.
func (d *decoder) full(what string, p []byte) {
	if d.err != nil {
		return
	}
	n, err := io.ReadFull(d.r, p)
	d.left -= int64(n)
	if err != nil {
		d.fail("%s: %v", what, err)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, err := binary.ReadUvarint(d)
	if err != nil {
		d.fail("%s: %v", what, err)
	}
	return v
}

// size reads a length of what, which the rest of the body must hold at
// least unit bytes of per item.
func (d *decoder) size(what string, unit int64) int64 {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(d.left/unit) {
		d.fail("%s: length %d, more than the %d bytes left hold", what, n, d.left)
		return 0
	}
	return int64(n)
}

func (d *decoder) bytes(what string) []byte {
	b := make([]byte, d.size(what, 1))
	d.full(what, b)
	return b
}

func (d *decoder) string(what string) string { return string(d.bytes(what)) }

func (d *decoder) strings(what string) []string {
	n := d.size(what, 1)
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.string(what)
	}
	return ss
}

// end returns the decoder's error, or one if bytes are left unread.
func (d *decoder) end() error {
	if d.err == nil && d.left != 0 {
		d.fail("%d bytes left after the end", d.left)
	}
	return d.err
}

// plan writes p but its fragments: what a server needs to execute it.
func (e *encoder) plan(p *partition.Plan) {
	e.strings(p.Feeds)
	e.strings(p.Fetches)
	e.uvarint(uint64(len(p.Rounds)))
	for _, round := range p.Rounds {
		e.uvarint(uint64(len(round)))
		for _, run := range round {
			e.string(run.Task)
			e.uvarint(uint64(len(run.Feeds)))
			for _, f := range run.Feeds {
				e.string(f.Tensor)
				e.string(f.Value)
			}
			e.strings(run.Fetches)
			e.strings(run.Targets)
		}
	}
}

func (d *decoder) plan() *partition.Plan {
	p := &partition.Plan{Feeds: d.strings("plan feeds"), Fetches: d.strings("plan fetches")}
	p.Rounds = make([][]partition.Run, d.size("rounds", 1))
	for i := range p.Rounds {
		p.Rounds[i] = make([]partition.Run, d.size("runs", 1))
		for k := range p.Rounds[i] {
			run := &p.Rounds[i][k]
			run.Task = d.string("task")
			run.Feeds = make([]partition.Feed, d.size("run feeds", 2))
			for j := range run.Feeds {
				run.Feeds[j] = partition.Feed{Tensor: d.string("feed tensor"), Value: d.string("feed value")}
			}
			run.Fetches = d.strings("run fetches")
			run.Targets = d.strings("run targets")
		}
	}
	return p
}

// stringMap writes m, sorted by key.
func (e *encoder) stringMap(m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.uvarint(uint64(len(keys)))
	for _, k := range keys {
		e.string(k)
		e.string(m[k])
	}
}

func (d *decoder) stringMap(what string) map[string]string {
	n := d.size(what, 2)
	m := make(map[string]string, n)
	for range n {
		k := d.string(what)
		m[k] = d.string(what)
	}
	return m
}

func (e *encoder) wireError(w wireError) {
	e.uvarint(uint64(w.kind))
	e.string(w.text)
	e.uvarint(uint64(w.code))
	e.string(w.op)
	e.string(w.msg)
	e.string(w.addr)
	e.string(w.task)
	e.uvarint(uint64(w.round))
}

func (d *decoder) wireError() wireError {
	var w wireError
	w.kind = byte(d.uvarint("error kind"))
	w.text = d.string("error text")
	w.code = tfrt.Code(d.uvarint("error code"))
	w.op = d.string("error op")
	w.msg = d.string("error message")
	w.addr = d.string("error address")
	w.task = d.string("error task")
	w.round = int(d.uvarint("error round"))
	return w
}
