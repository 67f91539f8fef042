package dataset_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/dataset"
)

func TestInputContext(t *testing.T) {
	ictx := dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 1, NumReplicasInSync: 4}
	require.NoError(t, ictx.Validate())
	n, err := ictx.PerReplicaBatchSize(64)
	require.NoError(t, err)
	assert.Equal(t, 16, n)
	_, err = ictx.PerReplicaBatchSize(10)
	require.ErrorIs(t, err, dataset.ErrNotDivisible)
	assert.Contains(t, err.Error(), "global batch size 10 by 4 replicas in sync")
	_, err = ictx.PerReplicaBatchSize(0)
	assert.ErrorIs(t, err, dataset.ErrInvalidArgument)
	assert.ErrorIs(t, dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 2, NumReplicasInSync: 1}.Validate(), dataset.ErrInvalidArgument)
	assert.ErrorIs(t, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 0}.Validate(), dataset.ErrInvalidArgument)
}

// step is one worker's Batch read back as ids.
type step struct {
	ids    [][]int64 // per local replica
	counts []int
	global int
	exact  bool
}

// readSteps runs one pass of d, checking that every replica's features stay
// aligned (x = {id, 2id, 3id}) and that Counts match the tensors.
func readSteps(t *testing.T, d *dataset.Distributed) []step {
	t.Helper()
	var out []step
	for b, err := range d.All(testCtx(t)) {
		require.NoError(t, err)
		s := step{counts: b.Counts, global: b.GlobalCount, exact: b.GlobalCountExact}
		require.Equal(t, len(out), b.Step)
		for r, e := range b.Replicas {
			ids := ints(t, e["id"])
			require.Len(t, ids, b.Counts[r], "replica %d", r)
			require.Equal(t, []int64{int64(b.Counts[r]), 3}, e["x"].Shape())
			if len(ids) > 0 {
				x := e["x"].Value().([][]float32)
				for i, id := range ids {
					require.Equal(t, []float32{float32(id), float32(2 * id), float32(3 * id)}, x[i], "row %d of replica %d", i, r)
				}
			}
			s.ids = append(s.ids, ids)
		}
		out = append(out, s)
	}
	return out
}

func globalBatches(t *testing.T, ds dataset.Dataset) [][]int64 {
	t.Helper()
	elems, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	var out [][]int64
	for _, e := range elems {
		out = append(out, ints(t, e["id"]))
	}
	return out
}

// The central promise of DATA sharding, over random sizes: at every step the
// union of all workers' replicas is exactly the single-pipeline global batch;
// over a pass every example is seen exactly once; every full step gives each
// replica global/replicas examples, and a partial one is split as evenly as
// possible with its true global count.
func TestDataShardingProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 4))
	for trial := range 60 {
		n := rng.IntN(120)
		W, R, b := 1+rng.IntN(4), 1+rng.IntN(3), 1+rng.IntN(4)
		B := b * W * R
		drop := rng.IntN(3) == 0
		buffer, seed := 1+rng.IntN(50), rng.Uint64()
		epochs := 1 + rng.IntN(2) // a second epoch follows a partial batch
		name := fmt.Sprintf("trial %d: n=%d workers=%d replicas=%d global=%d drop=%v epochs=%d", trial, n, W, R, B, drop, epochs)
		build := func() dataset.Dataset {
			return dataset.Prefetch(dataset.Repeat(dataset.Batched(dataset.Shuffle(idDataset(t, n), buffer, seed), B, drop), epochs), 2)
		}
		ref := globalBatches(t, build())
		ds := build()
		var perWorker [][]step
		for w := range W {
			policy := dataset.ShardData
			if w%2 == 1 {
				policy = dataset.ShardAuto // resolves to DATA: the data is not in files
			}
			d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, R,
				dataset.WithShardPolicy(policy))
			require.NoError(t, err, name)
			if W > 1 {
				require.Equal(t, dataset.ShardData, d.Policy(), name)
			}
			perWorker = append(perWorker, readSteps(t, d))
		}
		var seen []int64
		offset := 0 // position in the single pipeline of the step's first example
		for k, want := range ref {
			var union []int64
			var counts []int
			for w := range W {
				require.Len(t, perWorker[w], len(ref), "%s: worker %d takes as many steps as there are global batches", name, w)
				s := perWorker[w][k]
				assert.Equal(t, len(want), s.global, "%s: step %d", name, k)
				assert.True(t, s.exact, name)
				for r := range R {
					union = append(union, s.ids[r]...)
					counts = append(counts, s.counts[r])
					for _, id := range s.ids[r] {
						// DATA: worker w holds the examples i with i mod W == w.
						p := offset + slices.Index(want, id)
						assert.Equal(t, w, p%W, "%s: example %d at position %d on worker %d", name, id, p, w)
					}
				}
			}
			assert.ElementsMatch(t, want, union, "%s: step %d", name, k)
			if len(want) == B {
				for _, c := range counts {
					assert.Equal(t, b, c, "%s: full step %d", name, k)
				}
			}
			assert.LessOrEqual(t, slices.Max(counts)-slices.Min(counts), 1, "%s: step %d counts %v", name, k, counts)
			seen = append(seen, union...)
			offset += len(want)
		}
		assert.ElementsMatch(t, flatten(ref), seen, "%s: the workers together see the single pipeline's examples", name)
		if drop {
			assert.Len(t, seen, epochs*(n/B*B), name)
		} else {
			var all []int64
			for range epochs {
				all = append(all, seq(0, int64(n))...)
			}
			assert.ElementsMatch(t, all, seen, "%s: each example exactly once per epoch", name)
		}
	}
}

// Under BATCH sharding every replica gets the same examples, partial
// batches included, whether 1, 2 or 4 workers run the 4 replicas: the
// split of each global batch among every replica, as one worker makes it.
func TestBatchShardingIsTheSameOnEveryNumberOfWorkers(t *testing.T) {
	const replicas, B, n = 4, 8, 45 // a last batch of 5: counts 2, 1, 1, 1
	build := func() dataset.Dataset { return dataset.Batched(dataset.Shuffle(idDataset(t, n), 16, 7), B, false) }
	var want [][][]int64 // by step, by global replica
	for _, W := range []int{1, 2, 4} {
		var got [][][]int64
		for w := range W {
			d, err := dataset.Distribute(build(), dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: replicas}, replicas/W,
				dataset.WithShardPolicy(dataset.ShardBatch))
			require.NoError(t, err)
			if W > 1 {
				require.Equal(t, dataset.ShardBatch, d.Policy())
			}
			for k, s := range readSteps(t, d) {
				if w == 0 {
					got = append(got, nil)
				}
				got[k] = append(got[k], s.ids...)
				assert.Equal(t, min(B, n-k*B), s.global, "%d workers: step %d's global count", W, k)
			}
		}
		if want == nil {
			want = got
			require.Len(t, want, 6)
			assert.Equal(t, []int{2, 1, 1, 1}, []int{len(want[5][0]), len(want[5][1]), len(want[5][2]), len(want[5][3])}, "the partial batch, split as evenly as possible")
			continue
		}
		assert.Equal(t, want, got, "%d workers: each replica's examples", W)
	}
}

func flatten(batches [][]int64) []int64 {
	var out []int64
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

func TestSingleWorkerSplitsContiguously(t *testing.T) {
	ds := dataset.Batched(idDataset(t, 10), 6, false)
	d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 3}, 3, dataset.WithShardPolicy(dataset.ShardFile))
	require.NoError(t, err)
	assert.Equal(t, dataset.ShardOff, d.Policy(), "one worker: nothing to shard, whatever the policy")
	steps := readSteps(t, d)
	require.Len(t, steps, 2)
	assert.Equal(t, [][]int64{{0, 1}, {2, 3}, {4, 5}}, steps[0].ids)
	assert.Equal(t, 6, steps[0].global)
	assert.Equal(t, [][]int64{{6, 7}, {8}, {9}}, steps[1].ids, "the partial batch is split as evenly as possible")
	assert.Equal(t, []int{2, 1, 1}, steps[1].counts)
	assert.Equal(t, 4, steps[1].global, "the loss normaliser is the number of examples actually in the step")
	assert.True(t, steps[1].exact)

	// A final batch smaller than the replicas leaves some with no rows: their
	// tensors keep dtype and row shape, with a leading 0.
	d, err = dataset.Distribute(dataset.Batched(idDataset(t, 7), 6, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 3}, 3)
	require.NoError(t, err)
	var last *dataset.Batch
	for b, err := range d.All(testCtx(t)) {
		require.NoError(t, err)
		last = b
	}
	require.NotNil(t, last)
	assert.Equal(t, []int{1, 0, 0}, last.Counts)
	assert.Equal(t, []int64{0, 3}, last.Replicas[2]["x"].Shape())
	assert.Equal(t, tf.Float, last.Replicas[2]["x"].DataType())
	assert.Equal(t, []int64{0}, last.Replicas[2]["id"].Shape())
}

func TestOffShardingGivesEveryWorkerEverything(t *testing.T) {
	const W, R, B = 3, 2, 12
	ref := flatten(globalBatches(t, dataset.Batched(idDataset(t, 40), B, false)))
	for w := range W {
		d, err := dataset.Distribute(dataset.Batched(idDataset(t, 40), B, false),
			dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, R, dataset.WithShardPolicy(dataset.ShardOff))
		require.NoError(t, err)
		var got []int64
		for _, s := range readSteps(t, d) {
			local := 0
			for r := range R {
				got = append(got, s.ids[r]...)
				local += s.counts[r]
			}
			assert.LessOrEqual(t, local, B/W)
			assert.Equal(t, W*local, s.global, "every worker's step holds the same number of examples")
		}
		assert.Equal(t, ref, got, "worker %d sees every example, in order", w)
	}
}

// FILE sharding over random sizes: no file is read by two workers, every
// record is read once over all workers, and every worker batches by the
// per-worker batch.
func TestFileShardingProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	p, err := dataset.NewExampleParser(exampleSpec)
	require.NoError(t, err)
	for trial := range 12 {
		W, R := 2+rng.IntN(3), 1+rng.IntN(2)
		F := W + rng.IntN(5)
		n := F + rng.IntN(60)
		B := W * R * (1 + rng.IntN(3))
		name := fmt.Sprintf("trial %d: files=%d n=%d workers=%d replicas=%d global=%d", trial, F, n, W, R, B)
		src, err := dataset.TFRecordFiles([]string{exampleFiles(t, n, F)})
		require.NoError(t, err)
		ds := dataset.Batched(dataset.ParseExamples(dataset.Shuffle(src, 8, uint64(trial)), p), B, false)
		fileOf := map[int64]int{} // exampleFiles puts example i in file i mod F
		var all []int64
		for w := range W {
			policy := []dataset.ShardPolicy{dataset.ShardFile, dataset.ShardAuto}[w%2]
			d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, R,
				dataset.WithShardPolicy(policy))
			require.NoError(t, err, name)
			require.Equal(t, dataset.ShardFile, d.Policy(), name)
			for _, s := range readSteps(t, d) {
				local := 0
				for r := range R {
					for _, id := range s.ids[r] {
						fileOf[id] = int(id) % F
						assert.Equal(t, w, (int(id)%F)%W, "%s: example %d is in file %d, which belongs to worker %d", name, id, int(id)%F, (int(id)%F)%W)
					}
					all = append(all, s.ids[r]...)
					local += s.counts[r]
				}
				assert.LessOrEqual(t, local, B/W, name)
				assert.False(t, s.exact, name)
				assert.Equal(t, local+(W-1)*(B/W), s.global, name)
			}
		}
		assert.ElementsMatch(t, seq(0, int64(n)), all, name)
		assert.EqualValues(t, n, src.Stats().Records, "%s: each record was read from disk once, by one worker", name)
	}
}

func TestFileShardingNeedsEnoughFiles(t *testing.T) {
	p, err := dataset.NewExampleParser(exampleSpec)
	require.NoError(t, err)
	src, err := dataset.TFRecordFiles([]string{exampleFiles(t, 9, 2)})
	require.NoError(t, err)
	ds := dataset.Batched(dataset.ParseExamples(src, p), 3, false)
	ictx := func(w int) dataset.InputContext {
		return dataset.InputContext{NumInputPipelines: 3, InputPipelineID: w, NumReplicasInSync: 3}
	}
	_, err = dataset.Distribute(ds, ictx(0), 1, dataset.WithShardPolicy(dataset.ShardFile))
	require.ErrorIs(t, err, dataset.ErrTooFewFiles)
	assert.Contains(t, err.Error(), "2 files for 3 workers")

	// AUTO falls back to DATA, says so, and still reads every example once.
	core, logs := observer.New(zap.InfoLevel)
	var all []int64
	for w := range 3 {
		d, err := dataset.Distribute(ds, ictx(w), 1, dataset.WithLogger(zap.New(core)))
		require.NoError(t, err)
		assert.Equal(t, dataset.ShardData, d.Policy())
		for _, s := range readSteps(t, d) {
			all = append(all, s.ids[0]...)
		}
	}
	assert.ElementsMatch(t, seq(0, 9), all)
	fallbacks := logs.FilterMessage("AUTO sharding falls back to DATA").All()
	require.Len(t, fallbacks, 3)
	assert.Contains(t, fallbacks[0].ContextMap()["reason"], "2 files for 3 workers")

	_, err = dataset.Distribute(dataset.Batched(idDataset(t, 4), 3, false), ictx(0), 1, dataset.WithShardPolicy(dataset.ShardFile))
	require.ErrorIs(t, err, dataset.ErrNoFileSource)
	assert.Contains(t, err.Error(), "does not read files")
}

func TestDistributeRejectsBadShapes(t *testing.T) {
	ds := dataset.Batched(idDataset(t, 20), 10, false)
	_, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 4}, 4)
	require.ErrorIs(t, err, dataset.ErrNotDivisible)
	assert.Contains(t, err.Error(), "global batch size 10 by 4 replicas in sync")

	_, err = dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 2, NumReplicasInSync: 4}, 1)
	require.ErrorIs(t, err, dataset.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "4 replicas in sync, expected 1 local replicas × 2 workers = 2")

	_, err = dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2, dataset.WithGlobalBatchSize(4))
	assert.ErrorContains(t, err, "WithGlobalBatchSize(4), but the dataset is batched by 10")

	// An unbatched dataset: the failure names the feature and the fix.
	d, err := dataset.Distribute(idDataset(t, 4), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}, 1)
	require.NoError(t, err)
	_, err = readErr(t, d)
	require.ErrorIs(t, err, dataset.ErrShape)
	assert.Contains(t, err.Error(), `feature "id" is a scalar, expected a batch (is the dataset batched?)`)

	_, err = dataset.Distribute(dataset.Batched(idDataset(t, 4), 0, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}, 1)
	assert.ErrorIs(t, err, dataset.ErrInvalidArgument)
}

func readErr(t *testing.T, d *dataset.Distributed) (int, error) {
	n := 0
	for _, err := range d.All(testCtx(t)) {
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// opaque hides a dataset behind a type Distribute cannot look into.
type opaque struct{ dataset.Dataset }

func (o opaque) Iterator(ctx context.Context) (dataset.Iterator, error) {
	return o.Dataset.Iterator(ctx)
}

func TestDistributeForeignGlobalBatches(t *testing.T) {
	ds := opaque{dataset.Batched(idDataset(t, 10), 4, false)}
	ictx := dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}

	d, err := dataset.Distribute(ds, ictx, 1)
	require.NoError(t, err)
	steps := readSteps(t, d)
	assert.Len(t, steps, 3)

	// The global batch is inferred from the first batch, and checked.
	ictx.NumReplicasInSync = 2
	d, err = dataset.Distribute(ds, ictx, 2)
	require.NoError(t, err)
	steps = readSteps(t, d)
	assert.Equal(t, [][]int64{{8}, {9}}, steps[2].ids)

	ictx.NumReplicasInSync = 3
	d, err = dataset.Distribute(ds, ictx, 3)
	require.NoError(t, err)
	_, err = readErr(t, d)
	require.ErrorIs(t, err, dataset.ErrNotDivisible)
	assert.Contains(t, err.Error(), "inferred from the first batch")

	d, err = dataset.Distribute(opaque{dataset.Batched(idDataset(t, 10), 8, false)}, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2,
		dataset.WithGlobalBatchSize(4))
	require.NoError(t, err)
	_, err = readErr(t, d)
	assert.ErrorContains(t, err, "batch of 8 examples, expected at most 4")
}

func TestPassThroughKeepsTheTensor(t *testing.T) {
	x, err := tf.NewTensor([][]float32{{1, 2}, {3, 4}})
	require.NoError(t, err)
	ds, err := dataset.FromTensors(dataset.Element{"x": x})
	require.NoError(t, err)
	d, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}, 1, dataset.WithPrefetch(0))
	require.NoError(t, err)
	for b, err := range d.All(testCtx(t)) {
		require.NoError(t, err)
		assert.Same(t, x, b.Replicas[0]["x"], "a batch that goes whole to one replica is not copied")
	}
}

func TestDistributeFromFunction(t *testing.T) {
	const W, R, n = 2, 3, 23
	var all []int64
	for w := range W {
		var got dataset.InputContext
		calls := 0
		d, err := dataset.DistributeFromFunction(func(ictx dataset.InputContext) (dataset.Dataset, error) {
			got = ictx
			calls++
			per, err := ictx.PerReplicaBatchSize(12)
			if err != nil {
				return nil, err
			}
			return dataset.Batched(dataset.Shard(idDataset(t, n), ictx.NumInputPipelines, ictx.InputPipelineID), per, false), nil
		}, dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, R, dataset.WithGlobalBatchSize(12))
		require.NoError(t, err)
		assert.Equal(t, 1, calls, "one dataset per worker, as tf.distribute builds it")
		assert.Equal(t, dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: W * R}, got)
		steps := readSteps(t, d)
		// Worker 0 holds 12 examples (ids 0,2,..,22): batches of 2 dealt to
		// 3 replicas make 2 steps; worker 1 holds 11: the last replica of
		// its second step gets 1.
		require.Len(t, steps, 2)
		assert.Equal(t, [][]int64{{int64(w), int64(w + 2)}, {int64(w + 4), int64(w + 6)}, {int64(w + 8), int64(w + 10)}}, steps[0].ids)
		for _, s := range steps {
			assert.False(t, s.exact)
			assert.Equal(t, sum(s.counts)+(W*R-R)*2, s.global, "this worker's count plus full steps elsewhere")
			for _, ids := range s.ids {
				all = append(all, ids...)
			}
		}
	}
	assert.ElementsMatch(t, seq(0, n), all)

	// The data runs out mid-step: the remaining replicas get empty batches.
	d, err := dataset.DistributeFromFunction(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		return dataset.Batched(idDataset(t, 5), 2, false), nil
	}, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 4}, 4)
	require.NoError(t, err)
	steps := readSteps(t, d)
	require.Len(t, steps, 1)
	assert.Equal(t, []int{2, 2, 1, 0}, steps[0].counts)
	assert.Equal(t, 5, steps[0].global)
	assert.True(t, steps[0].exact, "all replicas in sync are local: the count is exact")

	_, err = dataset.DistributeFromFunction(func(dataset.InputContext) (dataset.Dataset, error) {
		return nil, fmt.Errorf("no data today")
	}, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}, 1)
	assert.ErrorContains(t, err, "dataset function: no data today")
	_, err = dataset.DistributeFromFunction(nil, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 3}, 2)
	assert.ErrorContains(t, err, "3 replicas in sync is not a multiple of 2 local replicas")
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func TestStageRunsAheadOnThePrefetchGoroutine(t *testing.T) {
	var staged atomic.Int64
	d, err := dataset.Distribute(dataset.Batched(idDataset(t, 40), 4, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2,
		dataset.WithPrefetch(2),
		dataset.WithStage(func(ctx context.Context, b *dataset.Batch) error {
			require.EqualValues(t, b.Step, staged.Load(), "staged in step order")
			staged.Add(1)
			return nil
		}))
	require.NoError(t, err)
	it, err := d.Iterator(testCtx(t))
	require.NoError(t, err)
	defer it.Close()
	b, err := it.Next(testCtx(t))
	require.NoError(t, err)
	assert.Equal(t, 0, b.Step)
	// While the consumer holds step 0, steps 1..3 are staged (2 buffered, 1
	// in hand) and no more.
	require.Eventually(t, func() bool { return staged.Load() == 4 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	assert.EqualValues(t, 4, staged.Load())

	failing, err := dataset.Distribute(dataset.Batched(idDataset(t, 40), 4, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 1}, 1,
		dataset.WithStage(func(ctx context.Context, b *dataset.Batch) error {
			if b.Step == 2 {
				return fmt.Errorf("device full")
			}
			return nil
		}))
	require.NoError(t, err)
	n, err := readErr(t, failing)
	assert.Equal(t, 2, n)
	assert.ErrorContains(t, err, "stage step 2: device full")
}

func TestDistIteratorHonoursContext(t *testing.T) {
	for _, prefetch := range []int{0, 2} {
		before := runtime.NumGoroutine()
		src := &countingDataset{n: 3, block: true}
		d, err := dataset.Distribute(dataset.Batched(src, 2, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2,
			dataset.WithPrefetch(prefetch))
		require.NoError(t, err)
		it, err := d.Iterator(testCtx(t))
		require.NoError(t, err)
		b, err := it.Next(testCtx(t))
		require.NoError(t, err)
		assert.Equal(t, []int{1, 1}, b.Counts)
		ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Millisecond)
		_, err = it.Next(ctx) // the source blocks after its third element
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "prefetch %d", prefetch)
		require.NoError(t, it.Close())
		_, err = it.Next(testCtx(t))
		assert.Error(t, err, "a closed iterator")
		requireGoroutinesAtMost(t, before)
	}
}

func ExampleDistribute() {
	// 10 examples, a global batch of 4, two workers with two replicas each:
	// this is worker 1's view.
	ids := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	ds, _ := dataset.FromSlices(map[string]any{"id": ids})
	ds = dataset.Batched(ds, 4, false)
	ictx := dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 1, NumReplicasInSync: 4}
	d, err := dataset.Distribute(ds, ictx, 2, dataset.WithShardPolicy(dataset.ShardData))
	if err != nil {
		fmt.Println(err)
		return
	}
	for b, err := range d.All(context.Background()) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(b.Replicas[0]["id"].Value(), b.Replicas[1]["id"].Value(), b.Counts, b.GlobalCount)
	}
	// Output:
	// [1] [3] [1 1] 4
	// [5] [7] [1 1] 4
	// [9] [] [1 0] 2
}

// With one pipeline per replica, fn is called once for each local replica
// with the replica as its pipeline, and replica g reads the same batches
// on 1, 2 or 4 workers: each step takes the next batch of every replica's
// own dataset, and one that has ended gives empty batches until all have.
func TestDistributePerReplicaIsTheSameOnEveryNumberOfWorkers(t *testing.T) {
	const N, n, per = 4, 23, 2 // pipelines of 6, 6, 6 and 5 examples
	var want [][][]int64       // want[g][step]: replica g's ids at each step
	for _, W := range []int{1, 2, 4} {
		R := N / W
		got := make([][][]int64, N)
		for w := range W {
			var calls []dataset.InputContext
			d, err := dataset.DistributePerReplica(func(ictx dataset.InputContext) (dataset.Dataset, error) {
				calls = append(calls, ictx)
				return dataset.Batched(dataset.Shard(idDataset(t, n), ictx.NumInputPipelines, ictx.InputPipelineID), per, false), nil
			}, dataset.InputContext{NumInputPipelines: W, InputPipelineID: w, NumReplicasInSync: N}, R, w*R, dataset.WithGlobalBatchSize(N*per))
			require.NoError(t, err)
			for r := range R {
				assert.Equal(t, dataset.InputContext{NumInputPipelines: N, InputPipelineID: w*R + r, NumReplicasInSync: N}, calls[r])
			}
			steps := readSteps(t, d)
			require.Len(t, steps, 3, "%d workers", W)
			for _, s := range steps {
				for r, ids := range s.ids {
					got[w*R+r] = append(got[w*R+r], ids)
				}
			}
			assert.Equal(t, []int{2, 2, 2, 1}[w*R:w*R+R], steps[2].counts, "%d workers: the last step's partial batches", W)
		}
		if want == nil {
			want = got
			var all []int64
			for _, g := range got {
				for _, ids := range g {
					all = append(all, ids...)
				}
			}
			assert.ElementsMatch(t, seq(0, n), all, "every example once")
			continue
		}
		assert.Equal(t, want, got, "%d workers", W)
	}
	_, err := dataset.DistributePerReplica(func(dataset.InputContext) (dataset.Dataset, error) { return idDataset(t, 1), nil },
		dataset.InputContext{NumInputPipelines: 2, InputPipelineID: 1, NumReplicasInSync: 4}, 2, 3)
	assert.ErrorContains(t, err, "first replica 3 of 2 local replicas, expected 0 <= first <= 2")
}
