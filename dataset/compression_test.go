package dataset_test

import (
	"encoding/hex"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/tfrecord"
	"github.com/tfdist/tfdist/internal/pyenv"
)

// payloads returns records of random bytes: an empty one, one of 100 KiB
// and small ones.
func payloads(n int) [][]byte {
	r := rand.New(rand.NewPCG(5, 6))
	out := make([][]byte, n)
	for i := range out {
		size := r.IntN(200)
		if i == 1 {
			size = 100 << 10
		}
		if i == 0 {
			size = 0
		}
		out[i] = make([]byte, size)
		for j := range out[i] {
			out[i][j] = byte(r.Uint32())
		}
	}
	return out
}

// writeCompressed writes recs to path through c with tfdist's writer.
func writeCompressed(t *testing.T, path string, c tfrecord.Compression, recs [][]byte) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	w, err := tfrecord.NewCompressedWriter(f, c)
	require.NoError(t, err)
	for _, r := range recs {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Close())
	require.NoError(t, f.Close())
}

// readRecords reads every record of the files with c through a dataset.
func readRecords(t *testing.T, c tfrecord.Compression, files ...string) [][]byte {
	t.Helper()
	ds, err := dataset.TFRecordFiles(files, dataset.WithCompression(c))
	require.NoError(t, err)
	elems, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	out := make([][]byte, len(elems))
	for i, e := range elems {
		out[i] = []byte(e[dataset.RecordKey].Value().(string))
	}
	return out
}

func hexes(recs [][]byte) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = hex.EncodeToString(r)
	}
	return out
}

// GZIP and ZLIB files written by TensorFlow's TFRecordWriter read back in
// tfdist byte for byte, and files tfdist writes read back in tf.data.
func TestCompressedTFRecordsInteroperate(t *testing.T) {
	recs := payloads(30)
	dir := t.TempDir()
	type file = map[string]any
	var writes, reads []file
	for _, c := range []tfrecord.Compression{tfrecord.GZIP, tfrecord.ZLIB} {
		py, goPath := filepath.Join(dir, "python-"+c.String()), filepath.Join(dir, "go-"+c.String())
		writes = append(writes, file{"path": py, "compression": c.String(), "records": hexes(recs)})
		writeCompressed(t, goPath, c, recs)
		reads = append(reads, file{"path": goPath, "compression": c.String()})
	}
	var out struct{ Read [][]string }
	pyenv.TensorFlow(t).JSON(t, "testdata/tfrecord_compression.py", map[string]any{"write": writes, "read": reads}, &out)
	require.Len(t, out.Read, 2)
	for i, c := range []tfrecord.Compression{tfrecord.GZIP, tfrecord.ZLIB} {
		assert.Equal(t, hexes(recs), out.Read[i], "%v: tf.data reads tfdist's file", c)
		assert.Equal(t, hexes(recs), hexes(readRecords(t, c, filepath.Join(dir, "python-"+c.String()))), "%v: tfdist reads TensorFlow's file", c)
	}
}

// A compressed file cut short fails the pass, naming it; under
// SkipCorrupt the records before the cut are read, and the rest of the
// file is counted as one corrupt record.
func TestCompressedCorruptionPolicy(t *testing.T) {
	recs := payloads(40)
	path := filepath.Join(t.TempDir(), "cut.gz")
	writeCompressed(t, path, tfrecord.GZIP, recs)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b[:len(b)*3/4], 0o644))

	ds, err := dataset.TFRecordFiles([]string{path}, dataset.WithCompression(tfrecord.GZIP))
	require.NoError(t, err)
	_, err = dataset.Collect(testCtx(t), ds)
	assert.ErrorIs(t, err, tfrecord.ErrCorrupt)
	assert.ErrorContains(t, err, path)

	skip, err := dataset.TFRecordFiles([]string{path}, dataset.WithCompression(tfrecord.GZIP), dataset.WithCorruptPolicy(dataset.SkipCorrupt))
	require.NoError(t, err)
	elems, err := dataset.Collect(testCtx(t), skip)
	require.NoError(t, err)
	require.NotEmpty(t, elems)
	require.Less(t, len(elems), len(recs))
	for i, e := range elems {
		assert.Equal(t, hex.EncodeToString(recs[i]), hex.EncodeToString([]byte(e[dataset.RecordKey].Value().(string))), "record %d", i)
	}
	st := skip.Stats()
	assert.Equal(t, int64(len(elems)), st.Records)
	assert.Equal(t, int64(1), st.Corrupt)
	assert.Zero(t, st.SkippedBytes, "the lost rest of a compressed stream has no known size")
}
