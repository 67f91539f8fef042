package dataset_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/tensorutil"
)

// The widths of the features the tests of lent buffers parse: an MNIST
// image's floats, and token ids as int64 and as int32, all wide enough
// that the parser lends the buffers it parses them into (the int32's as
// scratch).
const (
	lentWidth  = 784
	tokenWidth = 128
	shortWidth = 64
)

var lentSpec = dataset.FeatureSpec{
	"id":    {Type: tf.Int64},
	"x":     {Type: tf.Float, Shape: []int64{lentWidth}},
	"tok":   {Type: tf.Int64, Shape: []int64{tokenWidth}},
	"tok32": {Type: tf.Int32, Shape: []int64{shortWidth}},
}

// lentValue is value j of example i's "x", and of its token ids.
func lentValue(i, j int) float32 { return float32(i*1000 + j) }

// lentFiles writes n examples, "id" i and features of values lentValue(i,
// j), round-robin into 3 TFRecord files, and returns their glob pattern.
func lentFiles(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	recs := make([][][]byte, 3)
	x, tok := make([]float32, lentWidth), make([]int64, tokenWidth)
	for i := range n {
		for j := range x {
			x[j] = lentValue(i, j)
		}
		for j := range tok {
			tok[j] = int64(lentValue(i, j))
		}
		b, err := dataset.EncodeExample(map[string]any{"id": int64(i), "x": x, "tok": tok, "tok32": tok[:shortWidth]})
		require.NoError(t, err)
		recs[i%3] = append(recs[i%3], b)
	}
	for f, r := range recs {
		writeRecords(t, filepath.Join(dir, fmt.Sprintf("part-%d.tfrecord", f)), r)
	}
	return filepath.Join(dir, "*.tfrecord")
}

// parsedFiles reads and parses the files of pattern, one after another.
func parsedFiles(t testing.TB, pattern string) dataset.Dataset {
	t.Helper()
	p, err := dataset.NewExampleParser(lentSpec)
	require.NoError(t, err)
	src, err := dataset.TFRecordFiles([]string{pattern})
	require.NoError(t, err)
	return dataset.ParseExamples(src, p)
}

// checkRows checks that every row of el's features (of any rank) holds
// the values of the example its "id" names, and returns the ids. A buffer
// given back to the parser while a row still lay in it would hold poison
// (under PoisonLoans) or a later example's values by the time the row is
// copied out.
func checkRows(t testing.TB, el dataset.Element) []int64 {
	t.Helper()
	ids := ints(t, el["id"])
	checkFeature(t, "x", ids, lentWidth, tensorutil.Float32s(el["x"]))
	checkFeature(t, "tok", ids, tokenWidth, ints(t, el["tok"]))
	checkFeature(t, "tok32", ids, shortWidth, ints(t, el["tok32"]))
	return ids
}

// checkFeature checks that row r of a feature's values, width to a row,
// holds lentValue(ids[r], j).
func checkFeature[T float32 | int64](t testing.TB, name string, ids []int64, width int, vals []T) {
	t.Helper()
	require.Len(t, vals, len(ids)*width, name)
	for r, id := range ids {
		for j := range width {
			if want := T(lentValue(int(id), j)); vals[r*width+j] != want {
				require.Failf(t, "row overwritten", "%s: row %d (id %d), value %d: %v, want %v", name, r, id, j, vals[r*width+j], want)
			}
		}
	}
}

// TestLentBuffersStayIntact runs parsed examples through every stage that
// hands elements on, keeps them, or shares their rows, for two passes
// with collections in between, and checks that every row read holds its
// own example's values and that each pass has every example.
func TestLentBuffersStayIntact(t *testing.T) {
	dataset.PoisonLoans(t)
	const n = 300
	pattern := lentFiles(t, n)
	parser, err := dataset.NewExampleParser(lentSpec)
	require.NoError(t, err)
	interleaved := func(parallel int) dataset.Dataset {
		files, err := dataset.ListFiles([]string{pattern})
		require.NoError(t, err)
		return dataset.Interleave(files, func(e dataset.Element) (dataset.Dataset, error) {
			src, err := dataset.TFRecordFile(e[dataset.FilenameKey].Value().(string))
			return dataset.ParseExamples(src, parser), err
		}, 3, 2, dataset.WithParallelReads(parallel))
	}
	ds := func() dataset.Dataset { return parsedFiles(t, pattern) }
	cases := []struct {
		name string
		ds   dataset.Dataset
		ids  int // distinct examples a pass holds
	}{
		{"elements", ds(), n},
		{"batched", dataset.Batched(ds(), 32, false), n},
		{"cached then batched", dataset.Batched(dataset.Cache(ds()), 32, false), n},
		{"batched then cached", dataset.Cache(dataset.Batched(ds(), 32, false)), n},
		{"shuffled and batched", dataset.Batched(dataset.Shuffle(ds(), 64, 1), 16, false), n},
		{"parallel interleave", dataset.Batched(interleaved(3), 32, false), n},
		{"sequential interleave", dataset.Batched(interleaved(1), 32, false), n},
		{"unbatched", dataset.Batched(dataset.Unbatch(dataset.Batched(ds(), 32, false)), 7, false), n},
		{"rebatched", dataset.Rebatch(dataset.Batched(ds(), 32, false), 20, false), n},
		{"windows", dataset.Window(ds(), 5, 2, 1, false), n},
		{"padded", dataset.PaddedBatch(ds(), 32, false), n},
		{"prefetched", dataset.Prefetch(dataset.Batched(ds(), 32, false), 4), n},
		{"parsed in parallel", dataset.Batched(dataset.ParseExamples(mustRecords(t, pattern), parser, dataset.WithParallelism(2)), 32, false), n},
		{"taken, skipped, sharded", dataset.Batched(dataset.Shard(dataset.Skip(dataset.Take(ds(), 250), 10), 2, 1), 16, false), 120},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for pass := range 2 {
				seen := map[int64]bool{}
				for el, err := range dataset.All(testCtx(t), c.ds) {
					require.NoError(t, err)
					for _, id := range checkRows(t, el) {
						seen[id] = true
					}
				}
				require.Len(t, seen, c.ids, "pass %d", pass)
			}
		})
	}
}

// mustRecords is the records of the files of pattern.
func mustRecords(t testing.TB, pattern string) dataset.Dataset {
	t.Helper()
	src, err := dataset.TFRecordFiles([]string{pattern})
	require.NoError(t, err)
	return src
}

// TestDistributedLentBuffersStayIntact checks the rows of the per-replica
// batches Distribute makes of parsed global batches, as the DATA policy
// splits them and as OFF takes one global batch over several steps.
func TestDistributedLentBuffersStayIntact(t *testing.T) {
	dataset.PoisonLoans(t)
	pattern := lentFiles(t, 256)
	for policy, want := range map[dataset.ShardPolicy]int{dataset.ShardData: 128, dataset.ShardOff: 256} {
		t.Run(policy.String(), func(t *testing.T) {
			ictx := dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 1, NumReplicasInSync: 4}
			d, err := dataset.Distribute(dataset.Batched(parsedFiles(t, pattern), 32, false), ictx, 2, dataset.WithShardPolicy(policy))
			require.NoError(t, err)
			rows := 0
			for b, err := range d.All(testCtx(t)) {
				require.NoError(t, err)
				for _, el := range b.Replicas {
					rows += len(checkRows(t, el))
				}
			}
			assert.Equal(t, want, rows, "the examples this worker's steps take")
		})
	}
}

// TestParsingReusesBuffers checks that a steady pipeline of parsed and
// batched examples reuses the buffers it gives back: it allocates under
// two thirds of an example's values per example (about a quarter of them,
// or half under the race detector, whose pools drop a quarter of what
// they are given), where without giving back it allocates more than all
// of them.
func TestParsingReusesBuffers(t *testing.T) {
	const n = 3000
	ds := dataset.Batched(parsedFiles(t, lentFiles(t, n)), 32, false)
	pass := func() {
		for el, err := range dataset.All(testCtx(t), ds) {
			require.NoError(t, err)
			_ = el
		}
	}
	pass() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	pass()
	runtime.ReadMemStats(&after)
	perRecord := float64(after.TotalAlloc-before.TotalAlloc) / n
	values := 4*lentWidth + 8*tokenWidth + 4*shortWidth
	assert.Less(t, perRecord, float64(2*values)/3, "bytes allocated per example of %d bytes of values", values)
}
