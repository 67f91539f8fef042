package dataset_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// testCtx returns a context that ends with the test, bounded so that a hang
// fails the test instead of stalling the suite.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ints returns the values of an integer tensor (any rank) as int64s.
func ints(t testing.TB, x *tf.Tensor) []int64 {
	t.Helper()
	require.NotNil(t, x)
	var out []int64
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case int64:
			out = append(out, v)
		case int32:
			out = append(out, int64(v))
		case []int64:
			out = append(out, v...)
		case []int32:
			for _, y := range v {
				out = append(out, int64(y))
			}
		case [][]int64:
			for _, y := range v {
				walk(y)
			}
		case [][]int32:
			for _, y := range v {
				walk(y)
			}
		default:
			t.Fatalf("unexpected tensor value %T", v)
		}
	}
	walk(x.Value())
	return out
}

// collectInts reads one pass of ds and returns the values of key, flattened.
func collectInts(t testing.TB, ds dataset.Dataset, key string) []int64 {
	t.Helper()
	elems, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	var out []int64
	for _, e := range elems {
		out = append(out, ints(t, e[key])...)
	}
	return out
}

func seq(start, end int64) []int64 {
	out := make([]int64, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, i)
	}
	return out
}

// idDataset returns n examples with "id" int64 = i and "x" float32 [3] =
// {i, 2i, 3i}, so a row's features can be checked to travel together.
func idDataset(t testing.TB, n int) dataset.Dataset {
	t.Helper()
	ids := make([]int64, n)
	xs := make([][3]float32, n)
	for i := range n {
		ids[i] = int64(i)
		xs[i] = [3]float32{float32(i), float32(2 * i), float32(3 * i)}
	}
	ds, err := dataset.FromSlices(map[string]any{"id": ids, "x": xs})
	require.NoError(t, err)
	return ds
}

// countingDataset is a Dataset implemented outside the package: it yields
// "id" scalars 0..n-1, counting how many it produced; with block set it then
// waits for its context instead of ending.
type countingDataset struct {
	n      int
	block  bool
	pulls  atomic.Int64
	closes atomic.Int64
}

func (d *countingDataset) Iterator(context.Context) (dataset.Iterator, error) {
	return &countingIter{d: d}, nil
}

type countingIter struct {
	d *countingDataset
	i int
}

func (it *countingIter) Next(ctx context.Context) (dataset.Element, error) {
	if it.i >= it.d.n {
		if it.d.block {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, io.EOF
	}
	it.d.pulls.Add(1)
	x, err := tf.NewTensor(int64(it.i))
	if err != nil {
		return nil, err
	}
	it.i++
	return dataset.Element{"id": x}, nil
}

func (it *countingIter) Close() error { it.d.closes.Add(1); return nil }

// writeRecords writes a TFRecord file.
func writeRecords(t testing.TB, path string, recs [][]byte) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	w := tfrecord.NewWriter(f)
	for _, r := range recs {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, f.Close())
}

// exampleFiles writes n examples ("id" int64, "x" float32 [3] as in
// idDataset, "name" bytes) round-robin into files TFRecord files under a new
// directory, which it returns.
func exampleFiles(t testing.TB, n, files int) string {
	t.Helper()
	dir := t.TempDir()
	recs := make([][][]byte, files)
	for i := range n {
		b, err := dataset.EncodeExample(map[string]any{
			"id":   int64(i),
			"x":    []float32{float32(i), float32(2 * i), float32(3 * i)},
			"name": "example",
		})
		require.NoError(t, err)
		recs[i%files] = append(recs[i%files], b)
	}
	for f := range files {
		writeRecords(t, filepath.Join(dir, "part-"+string(rune('a'+f/26))+string(rune('a'+f%26))+".tfrecord"), recs[f])
	}
	return dir
}

var exampleSpec = dataset.FeatureSpec{
	"id": {Type: tf.Int64},
	"x":  {Type: tf.Float, Shape: []int64{3}},
}
