// Package tfrecord reads and writes TFRecord files, the framing TensorFlow
// uses for tf.data input files, TensorBoard event files and more.
//
// A TFRecord file is a sequence of records, each framed as
//
//	uint64 length           little endian
//	uint32 masked CRC-32C   of the 8 length bytes
//	byte   data[length]
//	uint32 masked CRC-32C   of data
//
// where the mask is ((crc >> 15) | (crc << 17)) + 0xa282ead8, as in
// TensorFlow's tensorflow/core/lib/hash/crc32c.h. Both checksums are verified
// on every read: a flipped bit anywhere in a record is reported as a
// [*CorruptError] that names the byte offset of the record, never returned as
// data. GZIP and ZLIB compressed files are read with [WithCompression] and
// written with [NewCompressedWriter].
//
// The package has no TensorFlow dependency; it is shared by the input
// pipelines of package dataset and by writers of TensorBoard event files.
package tfrecord

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// HeaderSize is the number of bytes that precede a record's data: the length
// and its masked checksum.
const HeaderSize = 12

// FooterSize is the number of bytes that follow a record's data: its masked
// checksum.
const FooterSize = 4

const maskDelta = 0xa282ead8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC returns the masked CRC-32C (Castagnoli) checksum of b, the
// checksum TFRecord framing stores.
func MaskedCRC(b []byte) uint32 {
	return Mask(crc32.Checksum(b, castagnoli))
}

// Mask masks a CRC-32C checksum the way TFRecord framing does. Masking keeps a
// checksum of data that itself contains checksums from being trivially
// related to them.
func Mask(crc uint32) uint32 {
	return ((crc >> 15) | (crc << 17)) + maskDelta
}

// Unmask inverts [Mask].
func Unmask(masked uint32) uint32 {
	rot := masked - maskDelta
	return (rot >> 17) | (rot << 15)
}

// ErrCorrupt is matched (with errors.Is) by every [*CorruptError].
var ErrCorrupt = errors.New("tfrecord: corrupt record")

// CorruptError reports a record that fails its checksums or ends early.
type CorruptError struct {
	// Offset is the byte offset, in the stream the reader was given, of the
	// header of the bad record.
	Offset int64
	// Reason says what is wrong, with the values found and expected.
	Reason string
	// Truncated reports that the stream ended inside the record; the error
	// then also matches io.ErrUnexpectedEOF.
	Truncated bool
	// Recoverable reports that the record's length was intact (only its data
	// failed the checksum), so the reader is positioned at the next record
	// and reading may continue past the bad one.
	Recoverable bool
}

// Error implements error.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("tfrecord: corrupt record at byte offset %d: %s", e.Offset, e.Reason)
}

// Is reports whether target is [ErrCorrupt], or io.ErrUnexpectedEOF for a
// truncated record.
func (e *CorruptError) Is(target error) bool {
	return target == ErrCorrupt || (e.Truncated && target == io.ErrUnexpectedEOF)
}

// AppendRecord appends the framed record holding data to dst and returns the
// extended slice.
func AppendRecord(dst, data []byte) []byte {
	var hdr [HeaderSize]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], MaskedCRC(hdr[:8]))
	dst = append(dst, hdr[:]...)
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, MaskedCRC(data))
}

// Writer writes framed records to an io.Writer.
//
// Each Write issues three writes to the underlying writer (header, data,
// footer); wrap a file in a bufio.Writer when writing many small records.
// A Writer is not safe for concurrent use.
type Writer struct {
	w      io.Writer
	closer io.Closer // the compressor, for NewCompressedWriter
	n      int64
	err    error
}

// NewWriter returns a Writer that frames records onto w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes data as one record. After an error every later Write returns
// the same error, since the stream's framing is then unknown.
func (w *Writer) Write(data []byte) error {
	if w.err != nil {
		return w.err
	}
	var hdr [HeaderSize]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], MaskedCRC(hdr[:8]))
	var ftr [FooterSize]byte
	binary.LittleEndian.PutUint32(ftr[:], MaskedCRC(data))
	for _, b := range [][]byte{hdr[:], data, ftr[:]} {
		n, err := w.w.Write(b)
		w.n += int64(n)
		if err != nil {
			w.err = fmt.Errorf("tfrecord: write record at byte offset %d: %w", w.n-int64(n), err)
			return w.err
		}
	}
	return nil
}

// Offset returns the number of bytes written so far: the offset at which the
// next record's header will start.
func (w *Writer) Offset() int64 { return w.n }
