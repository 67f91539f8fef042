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

// lentWidth is the width of the float feature the tests of lent buffers
// parse, an MNIST image's: wide enough that the parser lends the buffers
// it parses it into.
const lentWidth = 784

var lentSpec = dataset.FeatureSpec{
	"id": {Type: tf.Int64},
	"x":  {Type: tf.Float, Shape: []int64{lentWidth}},
}

// lentValue is value j of example i's "x".
func lentValue(i, j int) float32 { return float32(i*1000 + j) }

// lentFiles writes n examples, "id" i and "x" of lentWidth values
// lentValue(i, j), round-robin into 3 TFRecord files, and returns their
// glob pattern.
func lentFiles(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	recs := make([][][]byte, 3)
	x := make([]float32, lentWidth)
	for i := range n {
		for j := range x {
			x[j] = lentValue(i, j)
		}
		b, err := dataset.EncodeExample(map[string]any{"id": int64(i), "x": x})
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

// checkRows checks that every row of el's "x" (of any rank) holds the
// values of the example its "id" names, and returns the ids. A buffer
// given back to the parser while a row still lay in it would hold a later
// example's values by the time the row is copied out.
func checkRows(t testing.TB, el dataset.Element) []int64 {
	t.Helper()
	ids, xs := ints(t, el["id"]), tensorutil.Float32s(el["x"])
	require.Len(t, xs, len(ids)*lentWidth)
	for r, id := range ids {
		for j := range lentWidth {
			if xs[r*lentWidth+j] != lentValue(int(id), j) {
				require.Failf(t, "row overwritten", "row %d (id %d), value %d: %v, want %v", r, id, j, xs[r*lentWidth+j], lentValue(int(id), j))
			}
		}
	}
	return ids
}

// TestLentBuffersStayIntact runs parsed examples through every stage that
// hands elements on, keeps them, or shares their rows, for two passes
// with collections in between, and checks that every row read holds its
// own example's values and that each pass has every example.
func TestLentBuffersStayIntact(t *testing.T) {
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
					runtime.GC() // so that buffers given back are reused at once
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
				runtime.GC()
			}
			assert.Equal(t, want, rows, "the examples this worker's steps take")
		})
	}
}

// TestParsingReusesBuffers checks that a steady pipeline of parsed and
// batched examples reuses the buffers it gives back: it allocates far less
// per example than the example's own values.
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
	assert.Less(t, perRecord, float64(4*lentWidth)/2, "bytes allocated per example of %d bytes of values", 4*lentWidth)
}
