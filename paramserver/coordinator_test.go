package paramserver

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// The classifier trained by scheduled steps on two workers and two ps
// tasks reaches 90% held-out accuracy, and the ps tasks applied exactly one
// update per scheduled step.
func TestScheduledTrainingReachesNinetyPercent(t *testing.T) {
	s := newInProcess(t, 2, 2)
	ctx := testContext(t, 2*time.Minute)
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 64); return err }))
	train, eval := buildDigits(t, s, m, optimizer.NewSGD(optimizer.Constant(0.1)))
	c := newCoordinator(t, s)
	trainData, test := digitsData(t)
	input := perWorkerDigits(t, c, trainData, 64)
	const steps = 300
	var last *RemoteValue
	for range steps {
		rv, err := c.Schedule(train, input)
		require.NoError(t, err)
		last = rv
	}
	require.NoError(t, c.Join(ctx))
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, steps, applied, "one update per scheduled step")
	st := c.Stats()
	assert.Equal(t, steps, st.Succeeded)
	assert.Positive(t, st.PerWorker[0])
	assert.Positive(t, st.PerWorker[1], "both workers ran steps")
	out, err := last.Get(ctx)
	require.NoError(t, err)
	assert.Less(t, out["loss"].Value().(float32), float32(0.5))
	assert.GreaterOrEqual(t, accuracy(t, ctx, c, eval, test), 0.90)
}

// Each worker is fed from its own dataset: a step returns its input, and
// the input always came from the dataset of the worker that ran the step.
func TestPerWorkerDatasetFeedsItsOwnWorker(t *testing.T) {
	s := newInProcess(t, 2, 1)
	ctx := testContext(t, time.Minute)
	fn, err := s.Build(strategy.InputSpec{"w": {DType: tf.Int32, Shape: []int64{-1}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"w": in["w"]}, nil
		})
	require.NoError(t, err)
	c := newCoordinator(t, s)
	var contexts []dataset.InputContext
	d, err := c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		contexts = append(contexts, ictx)
		ds, err := dataset.FromSlices(map[string]any{"w": []int32{int32(ictx.InputPipelineID)}})
		return dataset.Batched(dataset.Repeat(ds, -1), 1, true), err
	})
	require.NoError(t, err)
	assert.Equal(t, []dataset.InputContext{{NumInputPipelines: 2, InputPipelineID: 0, NumReplicasInSync: 1},
		{NumInputPipelines: 2, InputPipelineID: 1, NumReplicasInSync: 1}}, contexts, "created once per worker")
	var rvs []*RemoteValue
	for range 40 {
		rv, err := c.Schedule(fn, d)
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	require.NoError(t, c.Join(ctx))
	seen := map[int]int{}
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		require.NoError(t, err)
		info := rv.Info()
		assert.Equal(t, []int32{int32(info.Worker)}, out["w"].Value())
		seen[info.Worker]++
	}
	assert.Len(t, seen, 2, "both workers ran steps")
}

// A step that fails with an error of its own is reported with that error,
// once, without a retry; Join reports it once; other steps are unaffected.
func TestStepErrorIsReportedNotRetried(t *testing.T) {
	s := newInProcess(t, 2, 1)
	ctx := testContext(t, time.Minute)
	var emb strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		emb, err = sc.Variable("emb", tf.Float, []int64{4, 2}, strategy.Zeros())
		return err
	}))
	fn, err := s.Build(strategy.InputSpec{"ids": {DType: tf.Int32, Shape: []int64{-1}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			rows, err := rc.Lookup(emb, in["ids"])
			return strategy.Outputs{"rows": rows}, err
		})
	require.NoError(t, err)
	c := newCoordinator(t, s)
	bad, err := c.Schedule(fn, Feed(dataset.Element{"ids": tensor(t, []int32{1, 9})}))
	require.NoError(t, err)
	good, err := c.Schedule(fn, Feed(dataset.Element{"ids": tensor(t, []int32{3})}))
	require.NoError(t, err)
	err = c.Join(ctx)
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.ErrorContains(t, err, `Lookup \"emb\": every id must be in [0, 4); the ids:] [1 9]`)
	assert.Len(t, se.Workers, 1, "not retried")
	assert.False(t, se.Retried)
	assert.ErrorIs(t, bad.Wait(ctx), err)
	assert.Equal(t, 1, bad.Info().Attempts)
	assert.NoError(t, good.Wait(ctx))
	assert.NoError(t, c.Join(ctx), "Join reports an error once")
	assert.Equal(t, 0, c.Stats().WorkerFailures)
}

// A step that fails on every worker as if the worker had died (here: it
// blocks past the step timeout) is retried a bounded number of times, then
// reported with its error; the workers, which are fine, run later steps.
func TestStepFailingOnEveryWorkerIsNotRetriedForever(t *testing.T) {
	// The stuck step takes this timeout on each of its attempts; the step
	// that runs after it must not reach it, even on a loaded machine, where
	// a worker's first run of a function takes longer.
	const stepTimeout = 2 * time.Second
	s := newInProcess(t, 2, 1, WithStepTimeout(stepTimeout))
	ctx := testContext(t, 2*time.Minute)
	// A dequeue from a queue nothing ever fills.
	stuckFn, err := s.Build(strategy.InputSpec{"x": {DType: tf.Int32, Shape: []int64{}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sc := rc.Scope()
			q := op.FIFOQueueV2(sc.SubScope("queue"), []tf.DataType{tf.Int32})
			deq := op.QueueDequeueV2(sc.SubScope("dequeue"), q, []tf.DataType{tf.Int32})
			return strategy.Outputs{"x": op.Add(sc.SubScope("add"), deq[0], in["x"])}, nil
		})
	require.NoError(t, err)
	okFn, err := s.Build(strategy.InputSpec{"x": {DType: tf.Int32, Shape: []int64{}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"x": in["x"]}, nil
		})
	require.NoError(t, err)
	c := newCoordinator(t, s, WithMaxAttempts(3), WithProbeInterval(20*time.Millisecond, 100*time.Millisecond))
	x := Feed(dataset.Element{"x": tensor(t, int32(1))})
	stuck, err := c.Schedule(stuckFn, x)
	require.NoError(t, err)
	start := time.Now()
	err = stuck.Wait(ctx)
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.True(t, se.Retried)
	assert.Len(t, se.Workers, 3)
	assert.ErrorContains(t, err, "ran past the step timeout")
	// Retried forever, it would be reported only when Wait's context ends,
	// 2 minutes away.
	assert.Less(t, time.Since(start), time.Minute, "reported after its 3 attempts of %v each", stepTimeout)
	assert.Error(t, c.Join(ctx))

	ok, err := c.Schedule(okFn, x)
	require.NoError(t, err)
	require.NoError(t, ok.Wait(ctx), "the workers came back")
	assert.GreaterOrEqual(t, c.Stats().Reconnects, 1)
}

// Misuse of the coordinator is an error, never a hang.
func TestScheduleMisuse(t *testing.T) {
	s := newInProcess(t, 1, 1)
	ctx := testContext(t, time.Minute)
	fn, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"x": in["x"]}, nil
		})
	require.NoError(t, err)
	c, err := NewCoordinator(s)
	require.NoError(t, err)
	_, err = NewCoordinator(s)
	assert.ErrorContains(t, err, "already has a coordinator")

	_, err = c.Schedule(nil, Feed(nil))
	assert.ErrorContains(t, err, "another strategy")
	_, err = c.Schedule(fn, nil)
	assert.ErrorContains(t, err, "nil input")
	_, err = c.Schedule(fn, Feed(dataset.Element{"y": tensor(t, []float32{1})}))
	assert.ErrorContains(t, err, `input "x" missing`)
	_, err = c.Schedule(fn, Feed(dataset.Element{"x": tensor(t, []int32{1})}))
	assert.ErrorContains(t, err, `input "x": dtype int32, expected float32`)
	_, err = c.Schedule(fn, Feed(dataset.Element{"x": tensor(t, [][]float32{{1}})}))
	assert.ErrorContains(t, err, `input "x": shape [1 1], expected [-1]`)

	// A step past the end of the per-worker dataset resolves with
	// ErrEndOfData, which wraps io.EOF and is no error of Join.
	d, err := c.CreatePerWorkerDataset(func(dataset.InputContext) (dataset.Dataset, error) {
		ds, err := dataset.FromSlices(map[string]any{"x": []float32{1}})
		return dataset.Batched(ds, 1, false), err
	})
	require.NoError(t, err)
	first, err := c.Schedule(fn, d)
	require.NoError(t, err)
	second, err := c.Schedule(fn, d)
	require.NoError(t, err)
	assert.NoError(t, first.Wait(ctx))
	assert.ErrorIs(t, second.Wait(ctx), ErrEndOfData)
	assert.ErrorIs(t, second.Wait(ctx), io.EOF)
	assert.NoError(t, c.Join(ctx))

	require.NoError(t, c.Done(ctx))
	_, err = c.Schedule(fn, Feed(dataset.Element{"x": tensor(t, []float32{1})}))
	assert.True(t, errors.Is(err, ErrDone))
	_, err = c.CreatePerWorkerDataset(func(dataset.InputContext) (dataset.Dataset, error) { return d.ds[0], nil })
	assert.True(t, errors.Is(err, ErrDone))
	c2, err := NewCoordinator(s)
	require.NoError(t, err, "a new coordinator once the first is done")
	require.NoError(t, c2.Done(ctx))
}

// idFunction returns a function that outputs the ids it is fed.
func idFunction(t *testing.T, s *Strategy) *Function {
	t.Helper()
	fn, err := s.Build(strategy.InputSpec{"id": {DType: tf.Int64, Shape: []int64{-1}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"id": in["id"]}, nil
		})
	require.NoError(t, err)
	return fn
}

// Per-worker datasets of different sizes: a loop that schedules until
// Schedule reports the end of the data, joining every few steps, runs each
// element of both datasets exactly once, on its own worker; Join reports no
// error; the consumption reported per worker is each dataset's size; the
// workers still run other steps.
func TestPerWorkerDatasetsEndingAtDifferentSizes(t *testing.T) {
	s := newInProcess(t, 2, 1)
	ctx := testContext(t, time.Minute)
	fn := idFunction(t, s)
	c := newCoordinator(t, s)
	sizes := []int64{3, 7}
	d, err := c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		lo := int64(100 * ictx.InputPipelineID)
		return dataset.Batched(dataset.Range("id", lo, lo+sizes[ictx.InputPipelineID]), 1, false), nil
	})
	require.NoError(t, err)
	var rvs []*RemoteValue
	for {
		rv, err := c.Schedule(fn, d)
		if errors.Is(err, ErrEndOfData) {
			break
		}
		require.NoError(t, err)
		rvs = append(rvs, rv)
		require.Less(t, len(rvs), 100, "Schedule never reported the end of the data")
		if len(rvs)%4 == 0 {
			require.NoError(t, c.Join(ctx))
		}
	}
	require.NoError(t, c.Join(ctx))
	seen := map[int64]int{}
	ended := 0
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		if errors.Is(err, ErrEndOfData) {
			ended++
			continue
		}
		require.NoError(t, err)
		id := out["id"].Value().([]int64)
		require.Len(t, id, 1)
		seen[id[0]]++
		assert.Equal(t, int(id[0]/100), rv.Info().Worker, "id %d ran on the worker whose dataset holds it", id[0])
	}
	want := map[int64]int{}
	for w, n := range sizes {
		for i := range n {
			want[int64(100*w)+i] = 1
		}
	}
	assert.Equal(t, want, seen, "every element exactly once")
	assert.Equal(t, []int{3, 7}, d.Consumed())
	st := c.Stats()
	assert.Equal(t, []int{3, 7}, st.PerWorker, "steps completed per worker")
	assert.Equal(t, 10, st.Succeeded)
	assert.Equal(t, 0, st.Failed)
	assert.Equal(t, ended, st.EndOfData)

	other, err := c.Schedule(fn, Feed(dataset.Element{"id": tensor(t, []int64{42})}))
	require.NoError(t, err)
	out, err := other.Get(ctx)
	require.NoError(t, err, "the workers run other steps after the data ended")
	assert.Equal(t, []int64{42}, out["id"].Value())
}

// Steps on a dataset that is empty on every worker resolve with
// ErrEndOfData instead of waiting, and Join returns without error.
func TestPerWorkerDatasetEmptyEverywhere(t *testing.T) {
	s := newInProcess(t, 2, 1)
	ctx := testContext(t, time.Minute)
	fn := idFunction(t, s)
	c := newCoordinator(t, s)
	d, err := c.CreatePerWorkerDataset(func(dataset.InputContext) (dataset.Dataset, error) {
		return dataset.Batched(dataset.Range("id", 0, 0), 1, false), nil
	})
	require.NoError(t, err)
	var rvs []*RemoteValue
	for range 5 {
		rv, err := c.Schedule(fn, d)
		if errors.Is(err, ErrEndOfData) {
			break
		}
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	require.NotEmpty(t, rvs)
	for _, rv := range rvs {
		err := rv.Wait(ctx)
		assert.ErrorIs(t, err, ErrEndOfData)
		assert.ErrorContains(t, err, "step "+fn.name)
	}
	require.NoError(t, c.Join(ctx))
	_, err = c.Schedule(fn, d)
	assert.ErrorIs(t, err, ErrEndOfData, "Schedule once the data ended everywhere")
	assert.Equal(t, []int{0, 0}, d.Consumed())
	assert.Equal(t, len(rvs), c.Stats().EndOfData)
	assert.Equal(t, 0, c.Stats().Failed)
}

// An error of a worker's dataset that is not its end fails the step with
// that error, named, and Join reports it.
func TestPerWorkerDatasetErrorFailsTheStep(t *testing.T) {
	s := newInProcess(t, 1, 1)
	ctx := testContext(t, time.Minute)
	fn := idFunction(t, s)
	c := newCoordinator(t, s)
	d, err := c.CreatePerWorkerDataset(func(dataset.InputContext) (dataset.Dataset, error) {
		ds := dataset.Map(dataset.Range("id", 0, 5), func(e dataset.Element) (dataset.Element, error) {
			if e["id"].Value().(int64) == 1 {
				return nil, errors.New("corrupt record 1")
			}
			return e, nil
		})
		return dataset.Batched(ds, 1, false), nil
	})
	require.NoError(t, err)
	first, err := c.Schedule(fn, d)
	require.NoError(t, err)
	require.NoError(t, first.Wait(ctx))
	second, err := c.Schedule(fn, d)
	require.NoError(t, err)
	err = second.Wait(ctx)
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.ErrorContains(t, err, "the dataset of worker 0")
	assert.ErrorContains(t, err, "corrupt record 1")
	assert.NotErrorIs(t, err, ErrEndOfData)
	assert.ErrorIs(t, c.Join(ctx), err)
	assert.Equal(t, 1, c.Stats().Failed)
}
