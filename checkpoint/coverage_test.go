package checkpoint

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	tspb "github.com/wamuir/graft/tensorflow/core/framework/tensor_slice_go_proto"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// part is one slice that saveParts writes.
type part struct {
	device, spec string
	value        any
}

// saveParts writes the slices parts of the tensor name to the checkpoint
// prefix with SaveShards, in a graph of its own.
func saveParts(t *testing.T, prefix, name string, parts ...part) {
	t.Helper()
	s := op.NewScope()
	var shards SaveShards
	for i, p := range parts {
		shards.Add(p.device, name, p.spec, op.Const(s.SubScope(fmt.Sprintf("value_%d", i)), p.value))
	}
	target := shards.Build(s, s, op.Const(s.SubScope("prefix"), prefix))
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Run(nil, nil, []*tf.Operation{target})
	require.NoError(t, err)
}

// zerosModel returns a default strategy with one float variable "w" of
// shape, zeros, and its Saver.
func zerosModel(t *testing.T, shape ...int64) (engine, *Saver) {
	t.Helper()
	e := newEngine(t, 0)
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("w", tf.Float, shape, strategy.Zeros())
		return err
	}))
	s, err := NewSaver(e)
	require.NoError(t, err)
	return e, s
}

// A variable saved as rows 0-1 of its 4 fails to restore with an
// IncompleteError naming the missing rows, and no variable changes.
func TestRestoreRejectsMissingRows(t *testing.T) {
	ctx := testContext(t)
	prefix := filepath.Join(t.TempDir(), "ckpt")
	saveParts(t, prefix, "w", part{"", "4 3 0,2:-", [][]float32{{1, 2, 3}, {4, 5, 6}}})

	e, s := zerosModel(t, 4, 3)
	_, err := s.Restore(ctx, prefix)
	var ie *IncompleteError
	require.True(t, errors.As(fmt.Errorf("wrapped: %w", err), &ie), "%v", err)
	assert.Equal(t, "w", ie.Name)
	assert.Equal(t, []int64{4, 3}, ie.Shape)
	assert.Equal(t, [][2]int64{{2, 4}, {0, 3}}, ie.Missing)
	assert.EqualError(t, err, fmt.Sprintf(`checkpoint: restore %s: variable "w" [4 3]: its slices cover rows 0-1; rows 2-3 are missing`, prefix))
	assert.Equal(t, make([]float64, 12), flat(t, values(t, e)["w"]))

	err = WarmStart(ctx, e, prefix, NameMap{"w": "w"})
	require.True(t, errors.As(err, &ie), "%v", err)
}

// A variable saved as slices from two shards, merged into one checkpoint,
// restores whole.
func TestRestoreJoinsSlices(t *testing.T) {
	ctx := testContext(t)
	prefix := filepath.Join(t.TempDir(), "ckpt")
	saveParts(t, prefix, "w",
		part{"", "4 3 0,2:-", [][]float32{{1, 2, 3}, {4, 5, 6}}},
		part{strategy.LocalCPU(0), "4 3 2,2:-", [][]float32{{7, 8, 9}, {10, 11, 12}}})
	ix, err := readIndex(prefix)
	require.NoError(t, err)
	assert.Equal(t, 2, ix.numShards)
	assert.ElementsMatch(t, [][]extent{{{0, 2}, {0, 3}}, {{2, 4}, {0, 3}}}, ix.entries["w"].slices)

	e, s := zerosModel(t, 4, 3)
	_, err = s.Restore(ctx, prefix)
	require.NoError(t, err)
	assert.Equal(t, [][]float32{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}, values(t, e)["w"].Value())
}

// Slices that cut the columns too leave a block missing, which the error
// names by its ranges of indices.
func TestRestoreRejectsMissingBlock(t *testing.T) {
	ctx := testContext(t)
	prefix := filepath.Join(t.TempDir(), "ckpt")
	block := [][]float32{{1, 2, 3}, {4, 5, 6}}
	saveParts(t, prefix, "w",
		part{"", "4 6 0,2:0,3", block}, part{"", "4 6 0,2:3,3", block}, part{"", "4 6 2,2:0,3", block})

	_, s := zerosModel(t, 4, 6)
	_, err := s.Restore(ctx, prefix)
	var ie *IncompleteError
	require.True(t, errors.As(err, &ie), "%v", err)
	assert.Equal(t, [][2]int64{{2, 4}, {3, 6}}, ie.Missing)
	assert.EqualError(t, err, fmt.Sprintf(`checkpoint: restore %s: variable "w" [4 6]: `+
		"its slices do not cover indices 2-3 of dimension 0, 3-5 of dimension 1", prefix))
}

// The coverage check is exact: overlapping slices whose sizes add up to
// the tensor's do not cover it.
func TestUncoveredIsExact(t *testing.T) {
	for _, c := range []struct {
		name  string
		shape []int64
		sl    [][]extent
		want  []extent
	}{
		{"whole", []int64{4}, [][]extent{{{0, 4}}}, nil},
		{"overlapping", []int64{4}, [][]extent{{{0, 3}}, {{1, 2}}}, []extent{{3, 4}}},
		{"rows in any order", []int64{5, 2}, [][]extent{{{3, 5}, {0, 2}}, {{0, 3}, {0, 2}}}, nil},
		{"gap", []int64{6}, [][]extent{{{0, 1}}, {{4, 6}}}, []extent{{1, 4}}},
		{"blocks", []int64{2, 2}, [][]extent{{{0, 1}, {0, 2}}, {{1, 2}, {1, 2}}}, []extent{{1, 2}, {0, 1}}},
		{"overlapping blocks", []int64{3, 3}, [][]extent{{{0, 2}, {0, 3}}, {{1, 3}, {0, 2}}}, []extent{{2, 3}, {2, 3}}},
		{"scalar", []int64{}, [][]extent{{}}, nil},
		{"empty", []int64{0, 3}, [][]extent{{{0, 0}, {0, 1}}}, nil},
	} {
		assert.Equal(t, c.want, uncovered(c.shape, c.sl), c.name)
	}
}

// The rows the error lists are the complement of the rows the slices
// cover, merged.
func TestIncompleteErrorListsRows(t *testing.T) {
	e := Entry{Name: "emb", Shape: []int64{10, 2}, slices: [][]extent{{{4, 6}, {0, 2}}, {{0, 2}, {0, 2}}, {{5, 7}, {0, 2}}, {{9, 10}, {0, 2}}}}
	assert.EqualError(t, e.complete("p"), `checkpoint: restore p: variable "emb" [10 2]: its slices cover rows 0-1, 4-6, 9; rows 2-3, 7-8 are missing`)
	e.slices = [][]extent{{{0, 0}, {0, 2}}}
	assert.EqualError(t, e.complete("p"), `checkpoint: restore p: variable "emb" [10 2]: its slices cover no rows; rows 0-9 are missing`)
	e.slices = nil
	assert.NoError(t, e.complete("p"))
}

// Slices that do not fit their tensor's shape make the index corrupt.
func TestEntrySlicesRejectsBadExtents(t *testing.T) {
	ext := func(start, length int64) *tspb.TensorSliceProto_Extent {
		return &tspb.TensorSliceProto_Extent{Start: start, HasLength: &tspb.TensorSliceProto_Extent_Length{Length: length}}
	}
	full := &tspb.TensorSliceProto_Extent{}
	got, err := entrySlices("w", []int64{4, 3}, []*tspb.TensorSliceProto{
		{Extent: []*tspb.TensorSliceProto_Extent{ext(2, 2), full}},
		{Extent: []*tspb.TensorSliceProto_Extent{ext(0, 2), ext(0, -1)}},
	})
	require.NoError(t, err)
	assert.Equal(t, [][]extent{{{2, 4}, {0, 3}}, {{0, 2}, {0, 3}}}, got)
	for _, bad := range [][]*tspb.TensorSliceProto_Extent{
		{ext(0, 2)},
		{ext(3, 2), full},
		{ext(-1, 1), full},
		{ext(1, -2), full},
		{ext(1, math.MaxInt64), full},
	} {
		_, err := entrySlices("w", []int64{4, 3}, []*tspb.TensorSliceProto{{Extent: bad}})
		assert.ErrorIs(t, err, ErrCorrupt, "%v", bad)
	}
}
