package dataset_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/dataset"
)

// TestOpsBadArguments: every invalid argument is reported by Err, naming the
// operation, the argument and its value.
func TestOpsBadArguments(t *testing.T) {
	r := rangeX(0, 3)
	same := func(dataset.Element) (dataset.Dataset, error) { return r, nil }
	for want, ds := range map[string]dataset.Dataset{
		"Window: size 0":             dataset.Window(r, 0, 1, 1, false),
		"Window: shift -1":           dataset.Window(r, 2, -1, 1, false),
		"Window: stride 0":           dataset.Window(r, 2, 1, 0, false),
		"Interleave: cycleLength 0":  dataset.Interleave(r, same, 0, 1),
		"Interleave: blockLength -2": dataset.Interleave(r, same, 1, -2),
		"Interleave: nil function":   dataset.Interleave(r, nil, 1, 1),
		"Interleave: parallel reads 0, expected 1 to cycleLength 2": dataset.Interleave(r, same, 2, 1, dataset.WithParallelReads(0)),
		"Interleave: parallel reads 3, expected 1 to cycleLength 2": dataset.Interleave(r, same, 2, 1, dataset.WithParallelReads(3)),
		"Rebatch: size 0":                  dataset.Rebatch(r, 0, false),
		"PaddedBatch: size 0":              dataset.PaddedBatch(r, 0, false),
		`padded shape [-2] of feature "x"`: dataset.PaddedBatch(r, 2, false, dataset.WithPaddedShape("x", -2)),
		"Zip: no datasets":                 dataset.Zip(nil),
		"Zip: dataset 1 is nil":            dataset.Zip([]dataset.Dataset{r, nil}),
		"Concatenate: nil Dataset":         dataset.Concatenate(r, nil),
		"Unbatch: nil Dataset":             dataset.Unbatch(nil),
		"Enumerate: nil Dataset":           dataset.Enumerate(nil, 0),
	} {
		err := dataset.Err(ds)
		require.ErrorIs(t, err, dataset.ErrInvalidArgument, want)
		assert.ErrorContains(t, err, want)
	}
	// An invalid input is reported through the combining operations.
	assert.ErrorContains(t, dataset.Err(dataset.Concatenate(r, dataset.Window(r, 0, 1, 1, false))), "Window: size 0")
}

// collectErr reads ds to its end and returns the error that ended it.
func collectErr(t *testing.T, ds dataset.Dataset) ([]dataset.Element, error) {
	t.Helper()
	return dataset.Collect(testCtx(t), ds)
}

func TestOpsBadElements(t *testing.T) {
	floats := mustSlices(t, map[string]any{"x": []float32{1, 2}})
	vec := func(lengths ...int64) dataset.Dataset {
		return mapX(t, rangeX(0, int64(len(lengths))), func(i int64) any { return fill(lengths[i], i) })
	}

	_, err := collectErr(t, dataset.Concatenate(rangeX(0, 2), floats))
	require.ErrorIs(t, err, dataset.ErrShape)
	assert.ErrorContains(t, err, `feature "x" is float32[] in the second dataset, int64[] in the first`)
	_, err = collectErr(t, dataset.Concatenate(rangeX(0, 2), dataset.Range("y", 0, 1)))
	assert.ErrorContains(t, err, "the second dataset's elements hold {y int64[]}, the first's {x int64[]}")

	_, err = collectErr(t, dataset.PaddedBatch(vec(2, 5, 3), 3, false, dataset.WithPaddedShape("x", 4)))
	require.ErrorIs(t, err, dataset.ErrShape)
	assert.ErrorContains(t, err, `feature "x" has an element of shape [5], larger than the padded shape [4]`)
	_, err = collectErr(t, dataset.PaddedBatch(vec(2, 5), 2, false, dataset.WithPaddedShape("x", 4, 4)))
	assert.ErrorContains(t, err, `feature "x" has shape [2], padded shape [4 4] has another rank`)
	_, err = collectErr(t, dataset.PaddedBatch(vec(2, 5), 2, false, dataset.WithPaddingValue("x", -1)))
	require.ErrorIs(t, err, dataset.ErrInvalidArgument)
	assert.ErrorContains(t, err, `feature "x": padding value: -1 of type int, expected a int64`)

	_, err = collectErr(t, dataset.Zip([]dataset.Dataset{rangeX(0, 2), rangeX(5, 7)}))
	assert.ErrorContains(t, err, `more than one dataset has a value named "x"`)
	_, err = collectErr(t, dataset.Enumerate(dataset.Range(dataset.IndexKey, 0, 2), 0))
	assert.ErrorContains(t, err, `already has a value named "index"`)
	_, err = collectErr(t, dataset.Unbatch(rangeX(0, 2)))
	require.ErrorIs(t, err, dataset.ErrShape)
	assert.ErrorContains(t, err, `Unbatch: input element 0: shape mismatch: feature "x" is a scalar`)
	_, err = collectErr(t, dataset.Interleave(rangeX(0, 2), func(dataset.Element) (dataset.Dataset, error) {
		return nil, errors.New("no such shard")
	}, 2, 1))
	assert.ErrorContains(t, err, "Interleave: input element 0: no such shard")
}

// TestZipLogsTheShortestInput: Zip stops at the shortest input, as tf.data
// does, and says so at debug level; inputs of one length log nothing.
func TestZipLogsTheShortestInput(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	log := dataset.WithLogger(zap.New(core))
	got, err := collectErr(t, dataset.Zip([]dataset.Dataset{dataset.Range("a", 0, 5), dataset.Range("b", 0, 3)}, log))
	require.NoError(t, err)
	assert.Len(t, got, 3)
	entries := logs.FilterMessage("dataset: Zip stopped at the shortest input").All()
	require.Len(t, entries, 1)
	assert.EqualValues(t, 1, entries[0].ContextMap()["ended"], "the second input ended first")
	assert.EqualValues(t, 3, entries[0].ContextMap()["elements"])

	_, err = collectErr(t, dataset.Zip([]dataset.Dataset{dataset.Range("a", 0, 3), dataset.Range("b", 0, 3)}, log))
	require.NoError(t, err)
	assert.Len(t, logs.FilterMessage("dataset: Zip stopped at the shortest input").All(), 1, "equal lengths: no message")
}

// TestZipReadsLikeTFData: when the first input is the shortest, Zip reads
// no further element of the others, as tf.data does, unless debug logging
// is on, where it reads one to say that the first input ended first.
func TestZipReadsLikeTFData(t *testing.T) {
	for _, debug := range []bool{false, true} {
		var reads atomic.Int64
		counted := dataset.Map(dataset.Range("b", 0, 5), func(e dataset.Element) (dataset.Element, error) {
			reads.Add(1)
			return e, nil
		})
		core, logs := observer.New(zap.DebugLevel)
		if !debug {
			core, logs = observer.New(zap.InfoLevel)
		}
		got, err := collectErr(t, dataset.Zip([]dataset.Dataset{dataset.Range("a", 0, 3), counted}, dataset.WithLogger(zap.New(core))))
		require.NoError(t, err)
		assert.Len(t, got, 3)
		entries := logs.FilterMessage("dataset: Zip stopped at the shortest input").All()
		if !debug {
			assert.EqualValues(t, 3, reads.Load(), "without debug logging, the second input is read as tf.data reads it")
			assert.Empty(t, entries)
			continue
		}
		assert.EqualValues(t, 4, reads.Load(), "with debug logging, one element more, to tell")
		require.Len(t, entries, 1)
		assert.EqualValues(t, 0, entries[0].ContextMap()["ended"], "the first input ended first")
	}
}

// recordFiles writes files TFRecord files of per records each, record j of
// file i being "f<i>-r<j>", and returns their directory.
func recordFiles(t *testing.T, files, per int) string {
	dir := t.TempDir()
	for i := range files {
		var recs [][]byte
		for j := range per {
			recs = append(recs, fmt.Appendf(nil, "f%02d-r%d", i, j))
		}
		writeRecords(t, filepath.Join(dir, fmt.Sprintf("part-%02d.tfrecord", i)), recs)
	}
	return dir
}

// fileOf returns the file part ("f03") of each record.
func fileOf(recs []string) []string {
	var out []string
	for _, r := range recs {
		out = append(out, strings.SplitN(r, "-", 2)[0])
	}
	return out
}

// TestFileShardingThroughInterleave: under FILE sharding (and AUTO) two
// workers read disjoint files behind an Interleave, which together are all
// the files, each batch of the per-worker size.
func TestFileShardingThroughInterleave(t *testing.T) {
	dir := recordFiles(t, 6, 5)
	files, err := dataset.ListFiles([]string{filepath.Join(dir, "*.tfrecord")})
	require.NoError(t, err)
	ds := dataset.Batched(dataset.Interleave(files, readFile(), 2, 1, dataset.WithParallelReads(2)), 4, false)

	seen := map[string]int{}
	for _, policy := range []dataset.ShardPolicy{dataset.ShardFile, dataset.ShardAuto} {
		clear(seen)
		for w := range 2 {
			d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 2, InputPipelineID: w, NumReplicasInSync: 2}, 1,
				dataset.WithShardPolicy(policy))
			require.NoError(t, err)
			require.Equal(t, dataset.ShardFile, d.Policy())
			var recs []string
			for b, err := range d.All(testCtx(t)) {
				require.NoError(t, err)
				require.LessOrEqual(t, b.Counts[0], 2, "per-worker batches of 4/2")
				recs = append(recs, b.Replicas[0][dataset.RecordKey].Value().([]string)...)
			}
			for _, f := range fileOf(recs) {
				seen[f] |= 1 << w
			}
		}
		require.Len(t, seen, 6, "%v: every file is read", policy)
		for f, workers := range seen {
			assert.Contains(t, []int{1, 2}, workers, "%v: file %s is read by exactly one worker", policy, f)
		}
	}

	shard, err := dataset.ShardFiles(ds, 3, 1)
	require.NoError(t, err)
	recs, err := recordsOf(t, dataset.Unbatch(shard))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"f01", "f04"}, slices.Compact(slices.Sorted(slices.Values(fileOf(recs)))))
}

// TestFileShardingRefusesSeveralInputs: FILE sharding cannot divide the
// inputs of a Zip or Concatenate among workers and says so; AUTO falls back
// to DATA, which shards the joined elements.
func TestFileShardingRefusesSeveralInputs(t *testing.T) {
	ds := dataset.Batched(dataset.Zip([]dataset.Dataset{dataset.Range("a", 0, 8), dataset.Range("b", 0, 8)}), 4, false)
	ictx := dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 0, NumReplicasInSync: 2}
	_, err := dataset.Distribute(ds, ictx, 1, dataset.WithShardPolicy(dataset.ShardFile))
	require.ErrorIs(t, err, dataset.ErrNoFileSource)
	assert.ErrorContains(t, err, "several inputs through Zip")
	d, err := dataset.Distribute(ds, ictx, 1)
	require.NoError(t, err)
	assert.Equal(t, dataset.ShardData, d.Policy())
}
