package tfrecord

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
)

// Compression is how a TFRecord file is compressed as a whole, as
// tf.io.TFRecordOptions' compression_type says.
type Compression int

// The compressions of TensorFlow's TFRecord readers and writers.
const (
	// NoCompression is a plain TFRecord stream (compression_type "").
	NoCompression Compression = iota
	// GZIP is a gzip stream (RFC 1952) of the records (compression_type "GZIP").
	GZIP
	// ZLIB is a zlib stream (RFC 1950) of the records (compression_type "ZLIB").
	ZLIB
)

// String returns the compression's name as TensorFlow spells it.
func (c Compression) String() string {
	switch c {
	case NoCompression:
		return ""
	case GZIP:
		return "GZIP"
	case ZLIB:
		return "ZLIB"
	}
	return fmt.Sprintf("Compression(%d)", int(c))
}

// ParseCompression parses a compression_type: "" (or "NONE"), "GZIP" or
// "ZLIB".
func ParseCompression(s string) (Compression, error) {
	switch s {
	case "", "NONE":
		return NoCompression, nil
	case "GZIP":
		return GZIP, nil
	case "ZLIB":
		return ZLIB, nil
	}
	return 0, fmt.Errorf("tfrecord: compression type %q: expected \"\", GZIP or ZLIB", s)
}

// WithCompression reads a stream compressed with c (default
// NoCompression). Offsets then count the decompressed bytes, and damage
// to the compressed stream (a corrupt block, a checksum that fails, a
// stream cut short) is a CorruptError that is not Recoverable.
func WithCompression(c Compression) ReaderOption {
	return func(r *Reader) { r.compression = c }
}

// decompress wraps src for the reader's compression; it reads the stream's
// header, so damage there is a CorruptError.
func (r *Reader) decompress(src io.Reader) (io.Reader, error) {
	var (
		dr  io.Reader
		err error
	)
	switch r.compression {
	case NoCompression:
		return src, nil
	case GZIP:
		dr, err = gzip.NewReader(src)
	case ZLIB:
		dr, err = zlib.NewReader(src)
	default:
		return nil, fmt.Errorf("tfrecord: %v: unknown compression", r.compression)
	}
	if err != nil {
		return nil, &CorruptError{Offset: 0, Truncated: errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF,
			Reason: fmt.Sprintf("%v header: %v", r.compression, err)}
	}
	return &corruptOnError{r: dr, c: r.compression, off: &r.off}, nil
}

// corruptOnError turns the decompressor's errors into CorruptErrors at the
// offset of the record being read.
type corruptOnError struct {
	r   io.Reader
	c   Compression
	off *int64
}

func (d *corruptOnError) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err == nil || err == io.EOF {
		return n, err
	}
	return n, &CorruptError{Offset: *d.off, Truncated: errors.Is(err, io.ErrUnexpectedEOF),
		Reason: fmt.Sprintf("%v stream: %v", d.c, err)}
}

// NewCompressedWriter returns a Writer that frames records onto w through
// c's compressor (gzip or zlib at their default level, as TensorFlow's
// writer). Close ends the compressed stream; Offset counts uncompressed
// bytes.
func NewCompressedWriter(w io.Writer, c Compression) (*Writer, error) {
	switch c {
	case NoCompression:
		return NewWriter(w), nil
	case GZIP:
		z := gzip.NewWriter(w)
		return &Writer{w: z, closer: z}, nil
	case ZLIB:
		z := zlib.NewWriter(w)
		return &Writer{w: z, closer: z}, nil
	}
	return nil, fmt.Errorf("tfrecord: %v: unknown compression", c)
}

// Close ends the compressed stream of a Writer made by
// NewCompressedWriter; the records are not all written until it returns.
// It does not close the underlying writer, and does nothing for an
// uncompressed Writer.
func (w *Writer) Close() error {
	if w.closer == nil {
		return w.err
	}
	err := w.closer.Close()
	w.closer = nil
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("tfrecord: close compressed stream: %w", err)
	}
	return w.err
}
