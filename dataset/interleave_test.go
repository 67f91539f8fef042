package dataset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// countedRecordFiles writes one TFRecord file per count, part-<i>.tfrecord
// holding records "f<i>-r<j>", and returns their directory and sorted paths.
func countedRecordFiles(t *testing.T, counts ...int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for i, n := range counts {
		var recs [][]byte
		for j := range n {
			recs = append(recs, fmt.Appendf(nil, "f%d-r%d", i, j))
		}
		p := filepath.Join(dir, fmt.Sprintf("part-%03d.tfrecord", i))
		writeRecords(t, p, recs)
		paths = append(paths, p)
	}
	return dir, paths
}

// readFile is the Interleave function that reads the TFRecord file named by
// its element.
func readFile(opts ...dataset.RecordOption) func(dataset.Element) (dataset.Dataset, error) {
	return func(e dataset.Element) (dataset.Dataset, error) {
		return dataset.TFRecordFile(e[dataset.FilenameKey].Value().(string), opts...)
	}
}

// mustTensor returns v as a tensor.
func mustTensor(v any) *tf.Tensor {
	t, err := tf.NewTensor(v)
	if err != nil {
		panic(err)
	}
	return t
}

// unevenInner maps input x to the x%7 elements x*100, x*100+1, ...: inputs
// of uneven lengths, some empty.
func unevenInner(e dataset.Element) (dataset.Dataset, error) {
	x := e["x"].Value().(int64)
	return dataset.Map(rangeX(0, x%7), func(y dataset.Element) (dataset.Element, error) {
		return dataset.Element{"x": mustTensor(x*100 + y["x"].Value().(int64))}, nil
	}), nil
}

// TestInterleaveParallelKeepsTheSequentialOrder: for every cycle, block and
// number of parallel reads, parallel reads yield exactly the sequential
// order, and non-deterministic ones the same elements.
func TestInterleaveParallelKeepsTheSequentialOrder(t *testing.T) {
	for _, cycle := range []int{1, 2, 3, 5, 40} {
		for _, block := range []int{1, 2, 7} {
			want := collectInts(t, dataset.Interleave(rangeX(0, 30), unevenInner, cycle, block), "x")
			require.Len(t, want, 85)
			for _, parallel := range []int{2, 3, 5} {
				if parallel > cycle {
					continue
				}
				name := fmt.Sprintf("cycle %d, block %d, %d reads", cycle, block, parallel)
				got := collectInts(t, dataset.Interleave(rangeX(0, 30), unevenInner, cycle, block, dataset.WithParallelReads(parallel)), "x")
				require.Equal(t, want, got, name)
				loose := collectInts(t, dataset.Interleave(rangeX(0, 30), unevenInner, cycle, block,
					dataset.WithParallelReads(parallel), dataset.Deterministic(false)), "x")
				require.ElementsMatch(t, want, loose, name+", non-deterministic")
			}
		}
	}
}

// TestInterleaveFunctionErrorsKeepTheirPlace: an error (or a panic) of the
// function for input element 4 ends the pass where the sequential order
// reaches that input, after the same elements, with or without parallel
// reads, although parallel reads call the function ahead.
func TestInterleaveFunctionErrorsKeepTheirPlace(t *testing.T) {
	for name, fail := range map[string]func(){
		"error": func() {},
		"panic": func() { panic("no such shard") },
	} {
		fn := func(e dataset.Element) (dataset.Dataset, error) {
			if e["x"].Value().(int64) == 4 {
				fail()
				return nil, errors.New("no such shard")
			}
			return unevenInner(e)
		}
		var first []int64
		var firstErr error
		for _, parallel := range []int{1, 3} {
			elems, err := collectErr(t, dataset.Interleave(rangeX(0, 10), fn, 3, 2, dataset.WithParallelReads(parallel)))
			require.Error(t, err, name)
			assert.ErrorContains(t, err, "Interleave: input element 4: ", name)
			assert.ErrorContains(t, err, "no such shard", name)
			var got []int64
			for _, e := range elems {
				got = append(got, ints(t, e["x"])...)
			}
			if parallel == 1 {
				first, firstErr = got, err
				require.NotEmpty(t, got)
				continue
			}
			assert.Equal(t, first, got, "%s: %d parallel reads", name, parallel)
			assert.Equal(t, firstErr.Error(), err.Error(), name)
		}
	}
}

// TestInterleaveCorruptRecords: a corrupt record behind an Interleave fails
// the pass at its place in the order, naming the file, with or without
// parallel reads; with SkipCorrupt it is skipped, logged with its file and
// counted, and a RecordCounter given to every file's source sums them all.
func TestInterleaveCorruptRecords(t *testing.T) {
	dir, _ := countedRecordFiles(t, 5, 5, 5)
	bad := filepath.Join(dir, "part-001.tfrecord")
	corruptFile(t, bad, false) // records r0, r1, then a corrupt r2, r3, r4
	files, err := dataset.ListFiles([]string{dir})
	require.NoError(t, err)
	for _, parallel := range []int{1, 3} {
		got, err := recordsOf(t, dataset.Interleave(files, readFile(), 3, 1, dataset.WithParallelReads(parallel)))
		require.ErrorIs(t, err, tfrecord.ErrCorrupt)
		assert.ErrorContains(t, err, bad)
		assert.Equal(t, []string{"f0-r0", "r0", "f2-r0", "f0-r1", "r1", "f2-r1", "f0-r2"}, got, "%d reads: the pass ends at the corrupt record", parallel)

		core, logs := observer.New(zap.WarnLevel)
		var counter dataset.RecordCounter
		skip := readFile(dataset.WithCorruptPolicy(dataset.SkipCorrupt), dataset.WithRecordCounter(&counter), dataset.WithLogger(zap.New(core)))
		got, err = recordsOf(t, dataset.Interleave(files, skip, 3, 1, dataset.WithParallelReads(parallel)))
		require.NoError(t, err)
		assert.Len(t, got, 5+4+5, "one record skipped")
		st := counter.Stats()
		assert.EqualValues(t, 14, st.Records, "every file's records")
		assert.EqualValues(t, 1, st.Corrupt)
		assert.Positive(t, st.SkippedBytes)
		entries := logs.FilterMessage("skipping corrupt TFRecord record").All()
		require.Len(t, entries, 1)
		assert.Equal(t, bad, entries[0].ContextMap()["file"])
	}
}

// TestTFRecordFileTakesItsNameAsItIs: TFRecordFile reads the file of that
// name even when it holds pattern characters (TFRecordFiles would glob
// it), fails a pass over a missing file naming it, and rejects bad options.
func TestTFRecordFileTakesItsNameAsItIs(t *testing.T) {
	dir := t.TempDir()
	writeRecords(t, filepath.Join(dir, "part[1].tfrecord"), [][]byte{[]byte("brackets")})
	writeRecords(t, filepath.Join(dir, "part1.tfrecord"), [][]byte{[]byte("plain")})
	ds, err := dataset.TFRecordFile(filepath.Join(dir, "part[1].tfrecord"))
	require.NoError(t, err)
	got, err := recordsOf(t, ds)
	require.NoError(t, err)
	assert.Equal(t, []string{"brackets"}, got)
	assert.EqualValues(t, 1, ds.Stats().Records)

	missing := filepath.Join(dir, "missing.tfrecord")
	ds, err = dataset.TFRecordFile(missing)
	require.NoError(t, err, "opened when a pass starts")
	_, err = recordsOf(t, ds)
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorContains(t, err, missing)

	_, err = dataset.TFRecordFile("")
	require.ErrorIs(t, err, dataset.ErrInvalidArgument)
	assert.ErrorContains(t, err, "TFRecordFile: invalid argument: empty file name")
	_, err = dataset.TFRecordFile(missing, dataset.WithCorruptPolicy(dataset.CorruptPolicy(7)))
	require.ErrorIs(t, err, dataset.ErrInvalidArgument)
	assert.ErrorContains(t, err, "TFRecordFile: invalid argument: corrupt policy CorruptPolicy(7)")
}

// TestListFilesOrder: ListFiles sorts the names of all its patterns
// together; ShuffleFiles shuffles them, the same way for the same seed, in
// a new order each pass.
func TestListFilesOrder(t *testing.T) {
	dir, paths := countedRecordFiles(t, 1, 1, 1, 1, 1, 1, 1, 1)
	names := func(ds dataset.Dataset) []string {
		t.Helper()
		elems, err := dataset.Collect(testCtx(t), ds)
		require.NoError(t, err)
		var out []string
		for _, e := range elems {
			out = append(out, e[dataset.FilenameKey].Value().(string))
		}
		return out
	}
	ds, err := dataset.ListFiles([]string{filepath.Join(dir, "part-00[4-7]*"), paths[1], filepath.Join(dir, "part-00[0-3]*")})
	require.NoError(t, err)
	assert.Equal(t, paths, names(ds), "sorted across patterns, each file once")

	shuffled := func(seed uint64) dataset.Dataset {
		ds, err := dataset.ListFiles([]string{dir}, dataset.ShuffleFiles(seed))
		require.NoError(t, err)
		return ds
	}
	a, b := shuffled(7), shuffled(7)
	first := names(a)
	assert.ElementsMatch(t, paths, first)
	assert.NotEqual(t, paths, first)
	assert.Equal(t, first, names(b), "the same seed, the same order")
	assert.NotEqual(t, first, names(a), "a new order in the next pass")
	assert.NotEqual(t, first, names(shuffled(8)), "another seed, another order")
}

// TestFileShardingOfShuffledFiles: FILE sharding divides the names of a
// shuffled ListFiles below an Interleave: each worker reads a disjoint
// share, the shares make up every file, and each worker's share is the
// same in every pass.
func TestFileShardingOfShuffledFiles(t *testing.T) {
	dir, _ := countedRecordFiles(t, 3, 3, 3, 3, 3, 3)
	files, err := dataset.ListFiles([]string{dir}, dataset.ShuffleFiles(1))
	require.NoError(t, err)
	ds := dataset.Batched(dataset.Interleave(files, readFile(), 2, 1, dataset.WithParallelReads(2)), 4, false)
	seen := map[string]int{}
	for w := range 2 {
		d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 2, InputPipelineID: w, NumReplicasInSync: 2}, 1,
			dataset.WithShardPolicy(dataset.ShardFile))
		require.NoError(t, err)
		var passes [][]string
		for range 2 {
			var recs []string
			for b, err := range d.All(testCtx(t)) {
				require.NoError(t, err)
				recs = append(recs, b.Replicas[0][dataset.RecordKey].Value().([]string)...)
			}
			passes = append(passes, slices.Sorted(slices.Values(recs)))
		}
		assert.Equal(t, passes[0], passes[1], "worker %d reads the same files in every pass", w)
		for _, f := range fileOf(passes[0]) {
			seen[f] |= 1 << w
		}
	}
	require.Len(t, seen, 6, "every file is read")
	for f, workers := range seen {
		assert.Contains(t, []int{1, 2}, workers, "file %s is read by exactly one worker", f)
	}
}

// TestAutoShardingThroughInterleave: AUTO shards by FILE the ListFiles below
// an Interleave when it lists at least as many files as workers, and by
// DATA when it lists fewer, where FILE fails naming the counts.
func TestAutoShardingThroughInterleave(t *testing.T) {
	ictx := dataset.InputContext{NumInputPipelines: 3, InputPipelineID: 0, NumReplicasInSync: 3}
	for files, want := range map[int]dataset.ShardPolicy{3: dataset.ShardFile, 2: dataset.ShardData} {
		dir, _ := countedRecordFiles(t, slices.Repeat([]int{2}, files)...)
		names, err := dataset.ListFiles([]string{dir})
		require.NoError(t, err)
		ds := dataset.Batched(dataset.Interleave(names, readFile(), 2, 1), 3, false)
		d, err := dataset.Distribute(ds, ictx, 1)
		require.NoError(t, err)
		assert.Equal(t, want, d.Policy(), "%d files for 3 workers", files)
		if want == dataset.ShardData {
			_, err := dataset.Distribute(ds, ictx, 1, dataset.WithShardPolicy(dataset.ShardFile))
			require.ErrorIs(t, err, dataset.ErrTooFewFiles)
			assert.ErrorContains(t, err, "2 files for 3 workers")
		}
	}
}

// gatedDataset yields one "x" element after its gate opens (or its
// context ends).
type gatedDataset struct {
	gate chan struct{}
	x    int64
}

func (d *gatedDataset) Iterator(context.Context) (dataset.Iterator, error) {
	return &gatedIter{d: d}, nil
}

type gatedIter struct {
	d    *gatedDataset
	done bool
}

func (it *gatedIter) Next(ctx context.Context) (dataset.Element, error) {
	if it.done {
		return nil, io.EOF
	}
	select {
	case <-it.d.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	it.done = true
	return dataset.Element{"x": mustTensor(it.d.x)}, nil
}

func (it *gatedIter) Close() error { return nil }

// TestInterleaveNonDeterministicPassesAStalledInput: with the first input
// stalled, a non-deterministic Interleave yields the other inputs'
// elements at once, where the deterministic one waits for the first.
func TestInterleaveNonDeterministicPassesAStalledInput(t *testing.T) {
	gate := make(chan struct{})
	fn := func(e dataset.Element) (dataset.Dataset, error) {
		x := e["x"].Value().(int64)
		if x == 0 {
			return &gatedDataset{gate: gate, x: 0}, nil
		}
		return dataset.FromTensors(dataset.Element{"x": mustTensor(x)})
	}
	next := func(it dataset.Iterator) (int64, error) {
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		defer cancel()
		e, err := it.Next(ctx)
		if err != nil {
			return 0, err
		}
		return e["x"].Value().(int64), nil
	}

	det, err := dataset.Interleave(rangeX(0, 3), fn, 3, 1, dataset.WithParallelReads(3)).Iterator(testCtx(t))
	require.NoError(t, err)
	defer det.Close()
	_, err = next(det)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the deterministic order waits for input 0")

	loose, err := dataset.Interleave(rangeX(0, 3), fn, 3, 1, dataset.WithParallelReads(3), dataset.Deterministic(false)).Iterator(testCtx(t))
	require.NoError(t, err)
	defer loose.Close()
	var got []int64
	for range 2 {
		x, err := next(loose)
		require.NoError(t, err, "the ready inputs pass the stalled one")
		got = append(got, x)
	}
	assert.ElementsMatch(t, []int64{1, 2}, got)

	close(gate)
	x, err := next(loose)
	require.NoError(t, err)
	assert.EqualValues(t, 0, x)
	_, err = next(loose)
	assert.ErrorIs(t, err, io.EOF)
	for _, want := range []int64{0, 1, 2} {
		x, err := next(det)
		require.NoError(t, err)
		assert.Equal(t, want, x)
	}
}

// TestInterleaveCloseReleasesEveryInput: closing a pass in its middle
// closes every input it opened (those of the cycle, and those opened ahead)
// exactly once, and ends every goroutine.
func TestInterleaveCloseReleasesEveryInput(t *testing.T) {
	before := runtime.NumGoroutine()
	var mu sync.Mutex
	var opened []*countingDataset
	fn := func(dataset.Element) (dataset.Dataset, error) {
		d := &countingDataset{n: 1000}
		mu.Lock()
		defer mu.Unlock()
		opened = append(opened, d)
		return d, nil
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(opened) }

	it, err := dataset.Interleave(rangeX(0, 50), fn, 4, 1, dataset.WithParallelReads(4)).Iterator(testCtx(t))
	require.NoError(t, err)
	for range 10 {
		_, err := it.Next(testCtx(t))
		require.NoError(t, err)
	}
	// The 4 inputs of the cycle, then 4 opened ahead and one more waiting.
	require.Eventually(t, func() bool { return count() == 9 }, 5*time.Second, time.Millisecond)
	require.NoError(t, it.Close())
	require.Equal(t, 9, count(), "nothing is opened after Close")
	for i, d := range opened {
		assert.EqualValues(t, 1, d.closes.Load(), "input %d is closed once", i)
	}
	requireGoroutinesAtMost(t, before)
}

// TestInterleaveReadsABoundedAmountAhead: a parallel read holds at most
// four chunks of an input (the one the consumer takes from, two buffered,
// one being filled), a chunk being 64 elements or 256 KiB, so that inputs
// of large elements do not fill memory.
func TestInterleaveReadsABoundedAmountAhead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		floats int
		ahead  int64
	}{
		{"small elements", 1, 4 * 64},
		{"128 KiB elements", 32 << 10, 4 * 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tf.NewTensor(make([]float32, tc.floats))
			require.NoError(t, err)
			var reads [4]atomic.Int64
			fn := func(e dataset.Element) (dataset.Dataset, error) {
				i := ints(t, e["x"])[0]
				return dataset.Map(dataset.Range("y", 0, 1000), func(dataset.Element) (dataset.Element, error) {
					reads[i].Add(1)
					return dataset.Element{"v": v}, nil
				}), nil
			}
			it, err := dataset.Interleave(rangeX(0, 4), fn, 4, 1, dataset.WithParallelReads(4)).Iterator(testCtx(t))
			require.NoError(t, err)
			defer it.Close()
			for range reads { // one element of each input
				_, err = it.Next(testCtx(t))
				require.NoError(t, err)
			}
			// The readers stop when their buffers are full: wait until no
			// count has moved for 50 ms.
			var last [4]int64
			require.Eventually(t, func() bool {
				moved := false
				for i := range reads {
					n := reads[i].Load()
					moved = moved || n != last[i]
					last[i] = n
				}
				return !moved
			}, 5*time.Second, 50*time.Millisecond, "the readers stop")
			for i := range last {
				assert.Greater(t, last[i], int64(1), "input %d reads ahead", i)
				assert.LessOrEqual(t, last[i], tc.ahead, "input %d", i)
			}
		})
	}
}
