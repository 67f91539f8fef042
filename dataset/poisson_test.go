package dataset_test

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
)

// poissonBatches returns the ids in each batch of one pass.
func poissonBatches(t *testing.T, ds dataset.Dataset) [][]int64 {
	t.Helper()
	elems, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	out := make([][]int64, len(elems))
	for i, e := range elems {
		require.Equal(t, tf.Int64, e["id"].DataType())
		out[i] = []int64{}
		if e["id"].Shape()[0] > 0 {
			out[i] = ints(t, e["id"])
		}
	}
	return out
}

// Each example is in each batch independently with the sampling rate:
// batch sizes average rate × examples with the binomial variance, examples
// come in order, two given examples are together at the rate squared, and
// every pass and every dataset with the seed draw the same batches.
func TestPoissonSampleIsPoisson(t *testing.T) {
	const n, rate, steps = 200, 0.3, 5000
	ds := dataset.PoissonSample(dataset.Range("id", 0, n), rate, steps, 7)
	batches := poissonBatches(t, ds)
	require.Len(t, batches, steps)
	var sum, sumSq, both float64
	counts := make([]float64, n)
	for _, b := range batches {
		assert.True(t, slices.IsSorted(b), "examples in order")
		sum += float64(len(b))
		sumSq += float64(len(b) * len(b))
		for _, id := range b {
			counts[id]++
		}
		if slices.Contains(b, 0) && slices.Contains(b, 1) {
			both++
		}
	}
	mean := sum / steps
	variance := sumSq/steps - mean*mean
	// 5 standard errors of each statistic.
	assert.InDelta(t, n*rate, mean, 5*math.Sqrt(n*rate*(1-rate)/steps), "mean batch size")
	assert.InDelta(t, n*rate*(1-rate), variance, 5*n*rate*(1-rate)*math.Sqrt(2.0/steps), "batch size variance")
	assert.InDelta(t, rate*rate*steps, both, 5*math.Sqrt(rate*rate*(1-rate*rate)*steps), "examples 0 and 1 together")
	for id, c := range counts {
		require.InDelta(t, rate*steps, c, 6*math.Sqrt(rate*(1-rate)*steps), "example %d", id)
	}

	assert.Equal(t, batches, poissonBatches(t, ds), "a second pass")
	assert.Equal(t, batches, poissonBatches(t, dataset.PoissonSample(dataset.Range("id", 0, n), rate, steps, 7)), "the same seed")
	assert.NotEqual(t, batches[:10], poissonBatches(t, dataset.PoissonSample(dataset.Range("id", 0, n), rate, 10, 8)), "another seed")
}

// A batch may hold no example: its tensors keep the dtype and have a first
// dimension of 0. A rate of 1 takes every example.
func TestPoissonSampleEdges(t *testing.T) {
	elems, err := dataset.Collect(testCtx(t), dataset.PoissonSample(idDataset(t, 5), 1e-6, 3, 1))
	require.NoError(t, err)
	require.Len(t, elems, 3)
	for _, e := range elems {
		assert.Equal(t, []int64{0}, e["id"].Shape())
		assert.Equal(t, tf.Int64, e["id"].DataType())
	}
	all := poissonBatches(t, dataset.PoissonSample(dataset.Range("id", 0, 7), 1, 2, 1))
	assert.Equal(t, [][]int64{seq(0, 7), seq(0, 7)}, all)
}

// Bad arguments fail naming the value and the range expected.
func TestPoissonSampleRefusesBadArguments(t *testing.T) {
	assert.ErrorContains(t, dataset.Err(dataset.PoissonSample(dataset.Range("id", 0, 5), 0, 10, 1)), "sampling rate 0, expected a rate in (0, 1]")
	assert.ErrorContains(t, dataset.Err(dataset.PoissonSample(dataset.Range("id", 0, 5), 1.5, 10, 1)), "sampling rate 1.5")
	assert.ErrorContains(t, dataset.Err(dataset.PoissonSample(dataset.Range("id", 0, 5), 0.5, -1, 1)), "-1 steps, expected 0 or more")
	_, err := dataset.Collect(testCtx(t), dataset.PoissonSample(dataset.Range("id", 0, 0), 0.5, 3, 1))
	assert.ErrorContains(t, err, "the dataset has no examples to sample from")
}

// Distributed over 1 worker, or by DATA over 2 workers, of 2 replicas, the
// workers' shares of each step are together exactly that step's Poisson
// sample, whatever its size, and GlobalCount is its size.
func TestPoissonSampleDistributes(t *testing.T) {
	const steps = 40
	ds := dataset.PoissonSample(dataset.Range("id", 0, 50), 0.2, steps, 3)
	want := poissonBatches(t, ds)
	for _, workers := range []int{1, 2} {
		got := make([][]int64, steps)
		for w := range workers {
			ictx := dataset.InputContext{NumInputPipelines: workers, InputPipelineID: w, NumReplicasInSync: 2 * workers}
			d, err := dataset.Distribute(ds, ictx, 2)
			require.NoError(t, err)
			k := 0
			for b, err := range d.All(testCtx(t)) {
				require.NoError(t, err)
				assert.Equal(t, len(want[k]), b.GlobalCount, "%d workers, step %d", workers, k)
				for _, r := range b.Replicas {
					if r["id"].Shape()[0] > 0 {
						got[k] = append(got[k], ints(t, r["id"])...)
					}
				}
				k++
			}
			assert.Equal(t, steps, k)
		}
		for k := range got {
			slices.Sort(got[k])
			if got[k] == nil {
				got[k] = []int64{}
			}
		}
		assert.Equal(t, want, got, "%d workers", workers)
	}
	_, err := dataset.Distribute(ds, dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2, dataset.WithGlobalBatchSize(10))
	assert.ErrorContains(t, err, "the dataset's batches are Poisson samples, of varying size")
}
