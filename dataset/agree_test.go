package dataset_test

import (
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
)

// Workers whose FILE shards hold different numbers of batches, one of them
// none, step in lockstep as a strategy makes them, each told after every
// step whether any worker has another batch: every worker's pass ends after
// the same step, a worker whose input ended gets padding batches of no
// examples, and every example is read once.
func TestUnevenWorkersEndTogether(t *testing.T) {
	ctx := testCtx(t)
	p, err := dataset.NewExampleParser(exampleSpec)
	require.NoError(t, err)
	const W, R, B = 3, 2, 12 // per worker 4, per replica 2
	// Files a, b, c go to workers 0, 1, 2: 9, 0 and 2 examples.
	dir := t.TempDir()
	sizes := []int{9, 0, 2}
	id := int64(0)
	for f, n := range sizes {
		var recs [][]byte
		for range n {
			b, err := dataset.EncodeExample(map[string]any{"id": id, "x": []float32{float32(id), float32(2 * id), float32(3 * id)}})
			require.NoError(t, err)
			recs, id = append(recs, b), id+1
		}
		writeRecords(t, filepath.Join(dir, fmt.Sprintf("%c.tfrecord", 'a'+f)), recs)
	}
	its := make([]*dataset.DistIterator, W)
	for w := range W {
		src, err := dataset.TFRecordFiles([]string{filepath.Join(dir, "*.tfrecord")})
		require.NoError(t, err)
		d, err := dataset.Distribute(dataset.Batched(dataset.ParseExamples(src, p), B, false),
			dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, R,
			dataset.WithShardPolicy(dataset.ShardFile))
		require.NoError(t, err)
		its[w], err = d.Iterator(ctx)
		require.NoError(t, err)
		defer its[w].Close()
	}
	var seen []int64
	paddings := make([]int, W)
	steps := 0
	for ; ; steps++ {
		batches := make([]*dataset.Batch, W)
		ended := 0
		for w, it := range its {
			b, err := it.Next(ctx)
			if err == io.EOF {
				ended++
				continue
			}
			require.NoError(t, err)
			require.True(t, b.NeedsAgreement())
			assert.Equal(t, steps, b.Step, "worker %d", w)
			if b.Padding {
				assert.Zero(t, b.LocalCount(), "worker %d step %d: padding holds no examples", w, steps)
				paddings[w]++
			}
			for r, e := range b.Replicas {
				if b.Counts[r] > 0 {
					seen = append(seen, ints(t, e["id"])...)
				}
			}
			batches[w] = b
		}
		if ended > 0 {
			require.Equal(t, W, ended, "step %d: every worker's pass ends at the same step", steps)
			break
		}
		anyNext := false
		for _, b := range batches {
			anyNext = anyNext || b.HasNext()
		}
		for _, b := range batches {
			b.Agree(anyNext)
		}
	}
	assert.Equal(t, 3, steps, "the longest shard's 3 batches (4+4+1 examples)")
	assert.ElementsMatch(t, seq(0, 11), seen, "every example once")
	assert.Equal(t, []int{0, 3, 2}, paddings, "a worker pads the steps after its input ends")
}
