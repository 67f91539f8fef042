package tfrecord_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// compressed writes recs through c and returns the stream.
func compressed(t *testing.T, c tfrecord.Compression, recs [][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := tfrecord.NewCompressedWriter(&buf, c)
	require.NoError(t, err)
	for _, r := range recs {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// GZIP and ZLIB streams read back record for record, and are smaller than
// the records when those compress.
func TestCompressedRoundTrip(t *testing.T) {
	recs := randomRecords(rand.New(rand.NewPCG(1, 2)), 50)
	recs = append(recs, bytes.Repeat([]byte("compressible "), 1000))
	for _, c := range []tfrecord.Compression{tfrecord.GZIP, tfrecord.ZLIB} {
		stream := compressed(t, c, recs)
		got, err := readAll(stream, tfrecord.WithCompression(c))
		require.NoError(t, err, c)
		require.Len(t, got, len(recs), c)
		for i := range recs {
			assert.True(t, bytes.Equal(recs[i], got[i]), "%v: record %d", c, i)
		}
		_, err = readAll(stream)
		assert.Error(t, err, "%v read as plain", c)
	}
}

// Damage to a compressed stream is detected: a flipped byte by the
// records' checksums or the stream's, a failed stream checksum or a cut as
// a CorruptError that loses the rest of the stream; the records before it
// are read intact.
func TestCompressedDamageIsCorrupt(t *testing.T) {
	recs := randomRecords(rand.New(rand.NewPCG(3, 4)), 40)
	for _, c := range []tfrecord.Compression{tfrecord.GZIP, tfrecord.ZLIB} {
		stream := compressed(t, c, recs)
		for _, damage := range []struct {
			name  string
			edit  func([]byte) []byte
			fatal bool // the first error loses the rest of the stream
		}{
			{"flipped byte", func(b []byte) []byte { b = bytes.Clone(b); b[len(b)/2] ^= 0x55; return b }, false},
			{"flipped stream checksum", func(b []byte) []byte { b = bytes.Clone(b); b[len(b)-5] ^= 0x01; return b }, true},
			{"cut", func(b []byte) []byte { return b[:len(b)*2/3] }, true},
		} {
			got, err := readAll(damage.edit(stream), tfrecord.WithCompression(c))
			var ce *tfrecord.CorruptError
			require.True(t, errors.As(err, &ce), "%v, %s: %v", c, damage.name, err)
			assert.ErrorIs(t, err, tfrecord.ErrCorrupt)
			if damage.fatal {
				assert.False(t, ce.Recoverable, "%v, %s", c, damage.name)
			}
			for i, rec := range got {
				assert.True(t, bytes.Equal(recs[i], rec), "%v, %s: record %d before the damage", c, damage.name, i)
			}
		}
		_, err := readAll([]byte("not a compressed stream"), tfrecord.WithCompression(c))
		assert.ErrorContains(t, err, c.String()+" header")
	}
}

func TestParseCompression(t *testing.T) {
	for s, want := range map[string]tfrecord.Compression{"": tfrecord.NoCompression, "NONE": tfrecord.NoCompression, "GZIP": tfrecord.GZIP, "ZLIB": tfrecord.ZLIB} {
		got, err := tfrecord.ParseCompression(s)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err := tfrecord.ParseCompression("gzip")
	assert.ErrorContains(t, err, `compression type "gzip": expected "", GZIP or ZLIB`)
}
