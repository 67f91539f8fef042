package dataset_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/pyenv"
)

// varLenExamples encodes examples whose features hold 0 to 5 values, or
// are absent.
func varLenExamples(t *testing.T) [][]byte {
	t.Helper()
	feats := []map[string]any{
		{"tokens": []int64{3, 1, 4, 1, 5}, "scores": []float32{0.5}, "tags": []string{"a", "bc"}},
		{"tokens": []int64{}, "scores": []float32{1, 2, 3}},
		{"scores": []float32{}, "tags": []string{"", "x\x00y", "zz"}},
		{"tokens": []int64{-7}, "tags": []string{}},
	}
	out := make([][]byte, len(feats))
	for i, f := range feats {
		b, err := dataset.EncodeExample(f)
		require.NoError(t, err)
		out[i] = b
	}
	return out
}

// VarLen features parse to the values tf.io.VarLenFeature gives (none for
// an absent feature), padded to MaxLen with the padding value or left at
// their own length, beside their int32 lengths; a feature longer than
// MaxLen is an error naming it.
func TestVarLenFeaturesMatchTensorFlow(t *testing.T) {
	examples := varLenExamples(t)
	hexes := make([]string, len(examples))
	for i, e := range examples {
		hexes[i] = hex.EncodeToString(e)
	}
	var ref struct {
		Parsed []struct {
			Tokens []int64   `json:"tokens"`
			Scores []float32 `json:"scores"`
			Tags   []string  `json:"tags"`
		}
	}
	pyenv.TensorFlow(t).JSON(t, "testdata/varlen_reference.py", map[string]any{"examples": hexes,
		"features": map[string]string{"tokens": "int64", "scores": "float32", "tags": "string"}}, &ref)
	require.Len(t, ref.Parsed, len(examples))

	p, err := dataset.NewExampleParser(dataset.FeatureSpec{
		"tokens": {Type: tf.Int64, VarLen: true, MaxLen: 6, Default: -1},
		"scores": {Type: tf.Float, VarLen: true},
		"tags":   {Type: tf.String, VarLen: true, MaxLen: 4},
	})
	require.NoError(t, err)
	for i, ex := range examples {
		e, err := p.Parse(ex)
		require.NoError(t, err, "example %d", i)
		want := ref.Parsed[i]
		tokens := e["tokens"].Value().([]int64)
		n := int(e[dataset.LengthKey("tokens")].Value().(int32))
		assert.Equal(t, len(want.Tokens), n, "example %d: tokens length", i)
		assert.Len(t, tokens, 6)
		assert.Equal(t, append(append([]int64{}, want.Tokens...), repeat(int64(-1), 6-n)...), tokens, "example %d: tokens", i)

		scores := e["scores"].Value().([]float32)
		assert.Equal(t, len(want.Scores), int(e[dataset.LengthKey("scores")].Value().(int32)), "example %d: scores length", i)
		if len(want.Scores) > 0 {
			assert.Equal(t, want.Scores, scores, "example %d: scores, unpadded", i)
		} else {
			assert.Empty(t, scores)
		}

		tags := e["tags"].Value().([]string)
		m := int(e[dataset.LengthKey("tags")].Value().(int32))
		require.Equal(t, len(want.Tags), m, "example %d: tags length", i)
		require.Len(t, tags, 4)
		for j := range m {
			assert.Equal(t, want.Tags[j], hex.EncodeToString([]byte(tags[j])), "example %d: tag %d", i, j)
		}
		assert.Equal(t, repeat("", 4-m), tags[m:], "example %d: tags padding", i)
	}

	short, err := dataset.NewExampleParser(dataset.FeatureSpec{"tokens": {Type: tf.Int64, VarLen: true, MaxLen: 3}})
	require.NoError(t, err)
	_, err = short.Parse(examples[0])
	assert.ErrorIs(t, err, dataset.ErrFeatureSize)
	assert.ErrorContains(t, err, `feature "tokens"`)
	assert.ErrorContains(t, err, "holds 5 values, more than MaxLen 3")
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// Unpadded VarLen features batch with PaddedBatch, which pads each batch to
// its longest example; a bad VarLen spec is an error naming the feature.
func TestVarLenFeaturesPadPerBatch(t *testing.T) {
	p, err := dataset.NewExampleParser(dataset.FeatureSpec{"tokens": {Type: tf.Int64, VarLen: true}})
	require.NoError(t, err)
	var recs []string
	for _, ex := range varLenExamples(t) {
		recs = append(recs, string(ex))
	}
	src, err := dataset.FromSlices(map[string]any{dataset.RecordKey: recs})
	require.NoError(t, err)
	batches, err := dataset.Collect(testCtx(t), dataset.PaddedBatch(dataset.ParseExamples(src, p), 4, false))
	require.NoError(t, err)
	require.Len(t, batches, 1)
	assert.Equal(t, []int64{4, 5}, batches[0]["tokens"].Shape())
	assert.Equal(t, []int32{5, 0, 0, 1}, batches[0][dataset.LengthKey("tokens")].Value().([]int32))

	for spec, want := range map[string]dataset.Feature{
		"VarLen with shape [2]":      {Type: tf.Int64, VarLen: true, Shape: []int64{2}},
		"MaxLen -1":                  {Type: tf.Int64, VarLen: true, MaxLen: -1},
		"padding value: unsupported": {Type: tf.Int64, VarLen: true, Default: "x"},
	} {
		_, err := dataset.NewExampleParser(dataset.FeatureSpec{"tokens": want})
		assert.ErrorContains(t, err, spec)
		assert.ErrorContains(t, err, `feature "tokens"`)
	}
	_, err = dataset.NewExampleParser(dataset.FeatureSpec{"x": {Type: tf.Float, VarLen: true}, "x_length": {Type: tf.Int32}})
	assert.ErrorContains(t, err, `its length would be named "x_length", which the spec names too`)
}
