package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// savedIndex returns the bytes of an index file TensorFlow's SaveV2 wrote.
func savedIndex(t *testing.T) []byte {
	prefix := filepath.Join(t.TempDir(), "ckpt")
	e := newEngine(t, 0)
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		for _, name := range []string{"layer/kernel", "layer/kernel/Adam/m", "layer/kernel/Adam/v", "layer/bias", "Adam/iterations"} {
			dt, shape := tf.Float, []int64{3, 2}
			if name == "Adam/iterations" {
				dt, shape = tf.Int64, nil
			}
			if _, err := sc.Variable(name, dt, shape, strategy.Zeros()); err != nil {
				return err
			}
		}
		return nil
	}))
	s, err := NewSaver(e)
	require.NoError(t, err)
	require.NoError(t, s.Save(testContext(t), prefix, Metadata{"note": "x"}))
	b, err := os.ReadFile(IndexFile(prefix))
	require.NoError(t, err)
	return b
}

// The index reader reads what TensorFlow writes, and a damaged index is a
// clear error, never a panic or a wrong listing.
func TestIndexReaderRejectsDamage(t *testing.T) {
	b := savedIndex(t)
	ix, err := parseIndex(b)
	require.NoError(t, err)
	assert.Equal(t, 1, ix.numShards)
	assert.Len(t, ix.entries, 6)
	assert.Equal(t, Entry{Name: "layer/kernel/Adam/v", DType: tf.Float, Shape: []int64{3, 2}}, ix.entries["layer/kernel/Adam/v"])
	assert.Equal(t, Entry{Name: MetadataPrefix + "note", DType: tf.String, Shape: []int64{}}, ix.entries[MetadataPrefix+"note"])

	for n := range len(b) {
		_, err := parseIndex(b[:n])
		require.Error(t, err, "truncated to %d bytes", n)
		require.True(t, errors.Is(err, ErrCorrupt), "truncated to %d bytes: %v", n, err)
	}
	for i := range b {
		d := append([]byte(nil), b...)
		d[i] ^= 0x41
		got, err := parseIndex(d)
		if err != nil {
			require.True(t, errors.Is(err, ErrCorrupt), "byte %d flipped: %v", i, err)
			continue
		}
		// Only bytes no reader checks (the footer's padding) may change
		// without an error, and then the listing is unchanged.
		require.Equal(t, ix, got, "byte %d flipped", i)
	}
}

// testdata/tf218.index was written by TensorFlow 2.18's SaveV2 (by
// savedIndex): the reader keeps reading it without TensorFlow.
func TestIndexWrittenByTensorFlow218(t *testing.T) {
	ix, err := readIndex(filepath.Join("testdata", "tf218"))
	require.NoError(t, err)
	assert.Equal(t, 1, ix.numShards)
	assert.Equal(t, map[string]Entry{
		"Adam/iterations":       {Name: "Adam/iterations", DType: tf.Int64, Shape: []int64{}},
		"layer/bias":            {Name: "layer/bias", DType: tf.Float, Shape: []int64{3, 2}},
		"layer/kernel":          {Name: "layer/kernel", DType: tf.Float, Shape: []int64{3, 2}},
		"layer/kernel/Adam/m":   {Name: "layer/kernel/Adam/m", DType: tf.Float, Shape: []int64{3, 2}},
		"layer/kernel/Adam/v":   {Name: "layer/kernel/Adam/v", DType: tf.Float, Shape: []int64{3, 2}},
		MetadataPrefix + "note": {Name: MetadataPrefix + "note", DType: tf.String, Shape: []int64{}},
	}, ix.entries)
}

// FuzzParseIndex checks that no input makes the index reader panic.
func FuzzParseIndex(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, footerLen))
	if b, err := os.ReadFile(filepath.Join("testdata", "tf218.index")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := parseIndex(b)
		if err == nil && ix.numShards < 1 {
			t.Fatalf("accepted an index with %d shards", ix.numShards)
		}
	})
}
