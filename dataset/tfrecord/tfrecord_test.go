package tfrecord_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// randomRecords returns n records of random lengths, including an empty one
// and one larger than the reader's buffer.
func randomRecords(rng *rand.Rand, n int) [][]byte {
	recs := make([][]byte, n)
	for i := range recs {
		size := rng.IntN(300)
		switch i {
		case 0:
			size = 0
		case 1:
			size = 200 << 10
		}
		recs[i] = make([]byte, size)
		for j := range recs[i] {
			recs[i][j] = byte(rng.Uint32())
		}
	}
	return recs
}

func writeAll(t testing.TB, recs [][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := tfrecord.NewWriter(&buf)
	for _, r := range recs {
		require.NoError(t, w.Write(r))
	}
	require.Equal(t, int64(buf.Len()), w.Offset())
	return buf.Bytes()
}

func readAll(data []byte, opts ...tfrecord.ReaderOption) ([][]byte, error) {
	r := tfrecord.NewReader(bytes.NewReader(data), opts...)
	var out [][]byte
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, bytes.Clone(rec))
	}
}

func TestMaskRoundTripAndKnownValue(t *testing.T) {
	// TensorFlow's crc32c_test.cc: Value("hello world") = 0xc99465aa.
	assert.Equal(t, tfrecord.Mask(0xc99465aa), tfrecord.MaskedCRC([]byte("hello world")))
	for _, c := range []uint32{0, 1, 0xc99465aa, 0xffffffff, 0x12345678} {
		assert.Equal(t, c, tfrecord.Unmask(tfrecord.Mask(c)))
		assert.NotEqual(t, c, tfrecord.Mask(c), "masking changes the checksum")
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	recs := randomRecords(rand.New(rand.NewPCG(1, 2)), 50)
	data := writeAll(t, recs)
	got, err := readAll(data)
	require.NoError(t, err)
	require.Equal(t, len(recs), len(got))
	for i := range recs {
		assert.True(t, bytes.Equal(recs[i], got[i]), "record %d", i)
	}
	// AppendRecord frames exactly as Writer does.
	var appended []byte
	for _, r := range recs {
		appended = tfrecord.AppendRecord(appended, r)
	}
	assert.Equal(t, data, appended)
}

func TestReaderOffsetsPointAtRecords(t *testing.T) {
	recs := [][]byte{[]byte("a"), {}, []byte("hello")}
	data := writeAll(t, recs)
	r := tfrecord.NewReader(bytes.NewReader(data))
	var want int64
	for _, rec := range recs {
		assert.Equal(t, want, r.Offset())
		_, err := r.Next()
		require.NoError(t, err)
		want += tfrecord.HeaderSize + int64(len(rec)) + tfrecord.FooterSize
	}
	_, err := r.Next()
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, int64(len(data)), r.Offset())
}

// Every single flipped byte of a file is detected: the reader never returns
// altered data, and it names the offset of the damaged record.
func TestEveryFlippedByteIsDetected(t *testing.T) {
	recs := [][]byte{[]byte("first"), []byte("second record"), {}, []byte("last")}
	data := writeAll(t, recs)
	var starts []int64
	var off int64
	for _, r := range recs {
		starts = append(starts, off)
		off += tfrecord.HeaderSize + int64(len(r)) + tfrecord.FooterSize
	}
	recordAt := func(pos int) int {
		for i := len(starts) - 1; i >= 0; i-- {
			if int64(pos) >= starts[i] {
				return i
			}
		}
		return 0
	}
	for pos := range data {
		for _, flip := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(data)
			bad[pos] ^= flip
			got, err := readAll(bad)
			var ce *tfrecord.CorruptError
			require.ErrorAs(t, err, &ce, "byte %d flipped by %#x", pos, flip)
			assert.ErrorIs(t, err, tfrecord.ErrCorrupt)
			idx := recordAt(pos)
			assert.Equal(t, starts[idx], ce.Offset, "byte %d", pos)
			require.Len(t, got, idx, "records before the damaged one are returned")
			for i := range got {
				assert.Equal(t, recs[i], got[i])
			}
		}
	}
}

func TestDataCorruptionIsRecoverable(t *testing.T) {
	recs := [][]byte{[]byte("one"), []byte("two"), []byte("three")}
	data := writeAll(t, recs)
	bad := bytes.Clone(data)
	bad[tfrecord.HeaderSize+len(recs[0])+tfrecord.FooterSize+tfrecord.HeaderSize] ^= 0x10 // "two"
	r := tfrecord.NewReader(bytes.NewReader(bad))
	rec, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, "one", string(rec))
	_, err = r.Next()
	var ce *tfrecord.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.True(t, ce.Recoverable)
	assert.Contains(t, ce.Error(), "data checksum mismatch")
	rec, err = r.Next()
	require.NoError(t, err)
	assert.Equal(t, "three", string(rec))
}

func TestLengthCorruptionIsSticky(t *testing.T) {
	data := writeAll(t, [][]byte{[]byte("one"), []byte("two")})
	data[3] ^= 0x40
	r := tfrecord.NewReader(bytes.NewReader(data))
	_, err1 := r.Next()
	var ce *tfrecord.CorruptError
	require.ErrorAs(t, err1, &ce)
	assert.False(t, ce.Recoverable)
	assert.Contains(t, ce.Error(), "length checksum mismatch")
	_, err2 := r.Next()
	assert.Equal(t, err1, err2, "framing is lost: no record after a damaged length is trusted")
}

// Cutting a file anywhere but at a record boundary is reported as a
// truncated record, with its offset; at a boundary it is a clean io.EOF.
func TestTruncationAtEveryOffset(t *testing.T) {
	recs := [][]byte{[]byte("alpha"), {}, []byte("gamma!")}
	data := writeAll(t, recs)
	boundaries := map[int]int{0: 0}
	off := 0
	for i, r := range recs {
		off += tfrecord.HeaderSize + len(r) + tfrecord.FooterSize
		boundaries[off] = i + 1
	}
	for cut := 0; cut <= len(data); cut++ {
		got, err := readAll(data[:cut])
		if n, ok := boundaries[cut]; ok {
			require.NoError(t, err, "cut at %d", cut)
			assert.Len(t, got, n)
			continue
		}
		var ce *tfrecord.CorruptError
		require.ErrorAs(t, err, &ce, "cut at %d", cut)
		assert.True(t, ce.Truncated)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.Equal(t, int64(tfrecord.HeaderSize*len(got)+tfrecord.FooterSize*len(got)+lenSum(recs[:len(got)])), ce.Offset)
	}
}

func lenSum(recs [][]byte) int {
	n := 0
	for _, r := range recs {
		n += len(r)
	}
	return n
}

func TestHugeLengthIsRejectedWithoutAllocating(t *testing.T) {
	// A header whose length is intact (valid checksum) but absurd.
	var hdr [12]byte
	hdr[7] = 0x40 // 2^62
	crc := tfrecord.MaskedCRC(hdr[:8])
	hdr[8], hdr[9], hdr[10], hdr[11] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	_, err := readAll(hdr[:])
	require.ErrorIs(t, err, tfrecord.ErrCorrupt)
	assert.Contains(t, err.Error(), "exceeds the maximum")

	// A length under the maximum but beyond the stream: truncated, and the
	// reader only buffers what the stream holds.
	rec := tfrecord.AppendRecord(nil, make([]byte, 3<<20))
	_, err = readAll(rec[:2<<20], tfrecord.WithMaxRecordSize(8<<20))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err = readAll(rec, tfrecord.WithMaxRecordSize(1<<20))
	assert.ErrorContains(t, err, "exceeds the maximum 1048576")
}

type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

func TestUnderlyingErrorsAreWrapped(t *testing.T) {
	boom := errors.New("disk on fire")
	_, err := tfrecord.NewReader(failingReader{boom}).Next()
	assert.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, tfrecord.ErrCorrupt)
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, errors.New("disk full")
	}
	f.after--
	return len(p), nil
}

func TestWriterErrorsAreSticky(t *testing.T) {
	w := tfrecord.NewWriter(&failingWriter{after: 4})
	require.NoError(t, w.Write([]byte("ok")))
	err := w.Write([]byte("fails in the data"))
	require.ErrorContains(t, err, "disk full")
	assert.Equal(t, err, w.Write([]byte("later")))
}

// runGraph runs target (and fetches) in a fresh session of g.
func runGraph(t *testing.T, s *op.Scope, fetches []tf.Output, targets ...*tf.Operation) []*tf.Tensor {
	t.Helper()
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, fetches, targets)
	require.NoError(t, err)
	return out
}

// TensorFlow's own TFRecord writer (the DatasetToTFRecord kernel) produces a
// file our reader reads back exactly.
func TestReadsTensorFlowWrittenFile(t *testing.T) {
	recs := []string{"", "a", "tensorflow wrote this", string(bytes.Repeat([]byte{0, 1, 2, 0xff}, 5000))}
	for i := range 20 {
		recs = append(recs, fmt.Sprintf("record %d", i))
	}
	path := filepath.Join(t.TempDir(), "tf.tfrecord")

	s := op.NewScope()
	slices := op.Const(s.SubScope("records"), recs)
	ds := op.TensorSliceDataset(s.SubScope("slices"), []tf.Output{slices}, []tf.Shape{tf.ScalarShape()})
	write := op.DatasetToTFRecord(s.SubScope("write"), ds,
		op.Const(s.SubScope("filename"), path), op.Const(s.SubScope("compression"), ""))
	runGraph(t, s, nil, write)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	got, err := readAll(data)
	require.NoError(t, err)
	require.Len(t, got, len(recs))
	for i := range recs {
		assert.Equal(t, recs[i], string(got[i]), "record %d", i)
	}
	// Byte for byte what our writer produces for the same records.
	var ours []byte
	for _, r := range recs {
		ours = tfrecord.AppendRecord(ours, []byte(r))
	}
	assert.Equal(t, ours, data)
}

// TensorFlow's own reader (the TFRecordDataset kernel, which verifies both
// checksums) reads what our writer wrote.
func TestTensorFlowReadsOurFile(t *testing.T) {
	recs := randomRecords(rand.New(rand.NewPCG(3, 4)), 12)
	path := filepath.Join(t.TempDir(), "ours.tfrecord")
	require.NoError(t, os.WriteFile(path, writeAll(t, recs), 0o644))

	s := op.NewScope()
	ds := op.TFRecordDataset(s.SubScope("ds"), op.Const(s.SubScope("files"), []string{path}),
		op.Const(s.SubScope("compression"), ""), op.Const(s.SubScope("buffer"), int64(1<<16)))
	batched := op.BatchDatasetV2(s.SubScope("batch"), ds, op.Const(s.SubScope("n"), int64(len(recs))),
		op.Const(s.SubScope("drop"), false), []tf.DataType{tf.String}, []tf.Shape{tf.MakeShape(-1)})
	all := op.DatasetToSingleElement(s.SubScope("single"), batched, []tf.DataType{tf.String}, []tf.Shape{tf.MakeShape(-1)})
	out := runGraph(t, s, all)
	got := out[0].Value().([]string)
	require.Len(t, got, len(recs))
	for i := range recs {
		assert.Equal(t, string(recs[i]), got[i], "record %d", i)
	}
}

// TestReadersReuseBuffersSafely: readers that end give their read buffer to
// the next ones; many readers of different streams, one after the other and
// at once, each read exactly their own records.
func TestReadersReuseBuffersSafely(t *testing.T) {
	const streams = 8
	var data [streams][]byte
	var recs [streams][][]byte
	for i := range streams {
		recs[i] = randomRecords(rand.New(rand.NewPCG(uint64(i), 7)), 20)
		data[i] = writeAll(t, recs[i])
	}
	var wg sync.WaitGroup
	for g := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pass := range 10 {
				i := (g + pass) % streams
				got, err := readAll(data[i])
				if !assert.NoError(t, err) || !assert.Len(t, got, len(recs[i])) {
					return
				}
				for j := range got {
					assert.True(t, bytes.Equal(recs[i][j], got[j]), "stream %d record %d", i, j)
				}
			}
		}()
	}
	wg.Wait()
}

// A reader closed before the end of its stream reads no more, and the
// readers after it, which reuse its read buffer, read their own streams
// exactly; the last record it returned stays intact.
func TestCloseEndsAReaderEarly(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	recs := randomRecords(rng, 50)
	data := writeAll(t, recs)
	others := randomRecords(rng, 50)
	other := writeAll(t, others)
	for i := range 20 {
		r := tfrecord.NewReader(bytes.NewReader(data))
		var last []byte
		for j := range i % 7 {
			rec, err := r.Next()
			require.NoError(t, err)
			require.True(t, bytes.Equal(recs[j], rec))
			last = rec
		}
		require.NoError(t, r.Close())
		_, err := r.Next()
		require.ErrorIs(t, err, tfrecord.ErrClosed)
		got, err := readAll(other)
		require.NoError(t, err)
		require.Len(t, got, len(others))
		for j := range got {
			require.True(t, bytes.Equal(others[j], got[j]), "pass %d record %d", i, j)
		}
		if n := i % 7; n > 0 {
			require.True(t, bytes.Equal(recs[n-1], last), "pass %d: the last record read before Close", i)
		}
	}
}
