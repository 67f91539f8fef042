package tfrecord

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// DefaultMaxRecordSize is the largest record a [Reader] accepts unless told
// otherwise: 1 GiB. A larger length is reported as corruption rather than
// trusted, so a damaged header cannot make the reader allocate without bound.
const DefaultMaxRecordSize = 1 << 30

// ReaderOption configures a [Reader].
type ReaderOption func(*Reader)

// WithMaxRecordSize sets the largest record length the reader accepts
// (default [DefaultMaxRecordSize]). Values below 1 are ignored.
func WithMaxRecordSize(n int64) ReaderOption {
	return func(r *Reader) {
		if n > 0 {
			r.max = n
		}
	}
}

// defaultBufferSize is the size of a Reader's read buffer unless told
// otherwise. Buffers of this size are reused from reader to reader: a
// pipeline that reads many files would otherwise allocate one per file.
const defaultBufferSize = 64 << 10

var bufferPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, defaultBufferSize) }}

// WithBufferSize sets the size of the read buffer (default 64 KiB). Values
// below 16 are ignored.
func WithBufferSize(n int) ReaderOption {
	return func(r *Reader) {
		if n >= 16 {
			r.bufSize = n
		}
	}
}

// Reader reads framed records from an io.Reader, verifying both checksums of
// every record. A Reader is not safe for concurrent use.
type Reader struct {
	src         io.Reader // the stream, until Next first reads it
	compression Compression
	r           *bufio.Reader
	off         int64 // offset of the next record's header
	max         int64
	bufSize     int
	buf         []byte
	hdr         [HeaderSize]byte // fields, not locals: passed to io.ReadFull they would escape
	ftr         [FooterSize]byte
	peeked      bool  // the record Next returned last lies in the read buffer
	err         error // sticky, once framing is lost or the stream ended
}

// NewReader returns a Reader of the records in r.
func NewReader(r io.Reader, opts ...ReaderOption) *Reader {
	rd := &Reader{src: r, max: DefaultMaxRecordSize, bufSize: defaultBufferSize}
	for _, o := range opts {
		o(rd)
	}
	return rd
}

// start opens the stream: its decompressor, if any, reads the header.
func (r *Reader) start() error {
	src, err := r.decompress(r.src)
	if err != nil {
		return r.fail(err)
	}
	if r.bufSize == defaultBufferSize {
		r.r = bufferPool.Get().(*bufio.Reader)
		r.r.Reset(src)
	} else {
		r.r = bufio.NewReaderSize(src, r.bufSize)
	}
	r.src = nil
	return nil
}

// release gives the read buffer back once the stream has ended or failed
// for good: no later call reads it, and the record Next returned last, if
// it lies in the buffer, was valid only until this call (see Close).
func (r *Reader) release() {
	if r.r != nil && r.r.Size() == defaultBufferSize {
		r.r.Reset(nil)
		bufferPool.Put(r.r)
	}
	r.r = nil
}

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("tfrecord: reader closed")

// Close ends reading before the end of the stream: it hands the read
// buffer on to later readers (one that reaches the end, or fails, does so
// itself), and Next then returns ErrClosed. It does not close the
// underlying reader, and leaves the record Next last returned as it was:
// when that record lies in the read buffer, the buffer is left to it.
func (r *Reader) Close() error {
	if r.err == nil {
		r.err = ErrClosed
	}
	if r.peeked {
		r.r = nil
	}
	r.release()
	return nil
}

// Offset returns the byte offset of the next record's header: after a
// successful Next, the offset just past the record returned.
func (r *Reader) Offset() int64 { return r.off }

// Next returns the data of the next record. The slice is valid only until the
// next call to Next; copy it to keep it.
//
// At a clean end of the stream (exactly at a record boundary) Next returns
// io.EOF. A record that fails a checksum or ends early is reported as a
// [*CorruptError]; when its Recoverable field is set, Next may be called again
// to read the records after it. Otherwise (the length was damaged or the
// stream ended inside the record) framing is lost, and every later call
// returns the same error. Errors of the underlying reader are returned
// wrapped, with the offset.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.r == nil {
		if err := r.start(); err != nil {
			return nil, err
		}
	}
	start := r.off
	hdr := r.hdr[:]
	n, err := io.ReadFull(r.r, hdr)
	switch {
	case err == io.EOF:
		r.err = io.EOF
		r.release()
		return nil, io.EOF
	case err == io.ErrUnexpectedEOF:
		return nil, r.fail(&CorruptError{Offset: start, Truncated: true,
			Reason: fmt.Sprintf("truncated header: %d of %d bytes", n, HeaderSize)})
	case err != nil:
		return nil, r.fail(fmt.Errorf("tfrecord: read header at byte offset %d: %w", start, err))
	}
	length := binary.LittleEndian.Uint64(hdr[:8])
	if got, want := MaskedCRC(hdr[:8]), binary.LittleEndian.Uint32(hdr[8:]); got != want {
		return nil, r.fail(&CorruptError{Offset: start,
			Reason: fmt.Sprintf("length checksum mismatch: stored 0x%08x, computed 0x%08x over length %d", want, got, length)})
	}
	if length > uint64(r.max) {
		return nil, r.fail(&CorruptError{Offset: start,
			Reason: fmt.Sprintf("record length %d exceeds the maximum %d", length, r.max)})
	}
	data, ftr, err := r.body(int(length))
	if err != nil {
		got := len(data) + len(ftr)
		switch {
		case !(errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF):
			return nil, r.fail(fmt.Errorf("tfrecord: read record at byte offset %d: %w", start, err))
		case got < int(length):
			return nil, r.fail(&CorruptError{Offset: start, Truncated: true,
				Reason: fmt.Sprintf("truncated data: %d of %d bytes", got, length)})
		default:
			return nil, r.fail(&CorruptError{Offset: start, Truncated: true,
				Reason: fmt.Sprintf("truncated data checksum: %d of %d bytes", got-int(length), FooterSize)})
		}
	}
	r.off = start + HeaderSize + int64(length) + FooterSize
	if got, want := MaskedCRC(data), binary.LittleEndian.Uint32(ftr); got != want {
		return nil, &CorruptError{Offset: start, Recoverable: true,
			Reason: fmt.Sprintf("data checksum mismatch: stored 0x%08x, computed 0x%08x over %d bytes", want, got, length)}
	}
	return data, nil
}

// body reads a record's n bytes of data and its footer. A record that fits
// in the read buffer is returned where it lies there, sparing a copy; a
// larger one is read into r.buf. On an error, data and ftr hold what was
// read.
func (r *Reader) body(n int) (data, ftr []byte, err error) {
	if n+FooterSize <= r.r.Size() {
		b, err := r.r.Peek(n + FooterSize)
		if _, derr := r.r.Discard(len(b)); err == nil {
			err = derr
		}
		r.peeked = err == nil
		return b[:min(n, len(b))], b[min(n, len(b)):], err
	}
	r.peeked = false
	if data, err = r.readData(n); err != nil {
		return data, nil, err
	}
	m, err := io.ReadFull(r.r, r.ftr[:])
	return data, r.ftr[:m], err
}

// readData reads n bytes into r.buf. It grows the buffer as data arrives, so
// a length that promises more than the stream holds costs no more memory than
// the stream does.
func (r *Reader) readData(n int) ([]byte, error) {
	const chunk = 1 << 20
	if n <= cap(r.buf) || n <= chunk {
		if cap(r.buf) < n {
			r.buf = make([]byte, n)
		}
		b := r.buf[:n]
		m, err := io.ReadFull(r.r, b)
		return b[:m], err
	}
	b := r.buf[:0]
	for len(b) < n {
		step := min(n-len(b), max(chunk, len(b)))
		if cap(b)-len(b) < step {
			nb := make([]byte, len(b), len(b)+step)
			copy(nb, b)
			b = nb
		}
		m, err := io.ReadFull(r.r, b[len(b):len(b)+step])
		b = b[:len(b)+m]
		if err != nil {
			return b, err
		}
	}
	r.buf = b
	return b, nil
}

func (r *Reader) fail(err error) error {
	r.err = err
	r.release()
	return err
}
