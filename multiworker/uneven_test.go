package multiworker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/dataset/tfrecord"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// unevenGlobal is the global batch of the uneven-input tests: 16 examples
// per worker, 8 per replica.
const unevenGlobal = 32

// Two workers whose files hold 3 and 5 per-worker batches (and, in the
// second case, a partial last one), under FILE sharding and with a dataset
// per replica from DistributeDatasetsFromFunction: neither hangs nor
// fails, both end after the same step, every example is used once, and the
// model equals the default strategy's trained on the union of the files,
// step by step.
func TestUnevenFilesEndTogether(t *testing.T) {
	d, err := digits.Load()
	require.NoError(t, err)
	per := unevenGlobal / 2
	for _, c := range []struct {
		sizes  [2]int
		fromFn bool
	}{{[2]int{3 * per, 5 * per}, false}, {[2]int{3 * per, 5*per - 6}, false}, {[2]int{3 * per, 5*per - 6}, true}} {
		sizes := c.sizes
		t.Run(fmt.Sprintf("%v from function %v", sizes, c.fromFn), func(t *testing.T) {
			// Worker w reads file w: examples [0, sizes[0]) and
			// [sizes[0], sizes[0]+sizes[1]) of the digits.
			dir := t.TempDir()
			writeDigits(t, filepath.Join(dir, "a.tfrecord"), d, 0, sizes[0])
			writeDigits(t, filepath.Join(dir, "b.tfrecord"), d, sizes[0], sizes[0]+sizes[1])
			want := trainUnionOnDefault(t, d, sizes)

			steps, examples := make([]int, 2), make([]int, 2)
			got := make([]map[string][]float32, 2)
			errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
				multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(20 * time.Second)},
				func(w int, s *multiworker.Strategy) (err error) {
					got[w], steps[w], examples[w], err = trainOnFiles(s, dir, c.fromFn)
					return err
				})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Equal(t, []int{5, 5}, steps, "both workers end after the longer input's last step")
			assert.Equal(t, []int{sizes[0], sizes[1]}, examples, "each worker used every example of its file once")
			for w := range 2 {
				diff, at := testmodel.MaxParamDiff(testmodel.Outcome{Params: want}, testmodel.Outcome{Params: got[w]})
				assert.Less(t, diff, 1e-4, "worker %d: %s differs from the default strategy's", w, at)
			}
		})
	}
}

// writeDigits writes examples [lo, hi) of d to path as tf.Examples.
func writeDigits(t *testing.T, path string, d digits.Data, lo, hi int) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	w := tfrecord.NewWriter(f)
	for i := lo; i < hi; i++ {
		b, err := dataset.EncodeExample(map[string]any{"x": d.X[i], "y": int64(d.Y[i])})
		require.NoError(t, err)
		require.NoError(t, w.Write(b))
	}
	require.NoError(t, f.Close())
}

// trainOnFiles trains the MLP on the files of dir for one pass, FILE-sharded
// or, fromFn, with worker w's replicas reading file w batch by batch in
// turn, and returns its variables, the steps it ran and the examples it
// used.
func trainOnFiles(s *multiworker.Strategy, dir string, fromFn bool) (map[string][]float32, int, int, error) {
	ctx := context.Background()
	var dist *dataset.Distributed
	var err error
	if fromFn {
		dist, err = s.DistributeDatasetsFromFunction(func(ic dataset.InputContext) (dataset.Dataset, error) {
			name := []string{"a", "b"}[ic.InputPipelineID] + ".tfrecord"
			return digitsRecords(filepath.Join(dir, name), unevenGlobal/ic.NumReplicasInSync)
		})
	} else {
		var ds dataset.Dataset
		if ds, err = digitsRecords(filepath.Join(dir, "*.tfrecord"), unevenGlobal); err == nil {
			dist, err = s.DistributeDataset(ds, dataset.WithShardPolicy(dataset.ShardFile))
		}
	}
	if err != nil {
		return nil, 0, 0, err
	}
	m, step, err := mlpStep(s)
	if err != nil {
		return nil, 0, 0, err
	}
	steps, examples := 0, 0
	for b, err := range dist.All(ctx) {
		if err != nil {
			return nil, steps, examples, err
		}
		if _, err := s.Run(ctx, step, b); err != nil {
			return nil, steps, examples, fmt.Errorf("step %d: %w", steps, err)
		}
		steps, examples = steps+1, examples+b.LocalCount()
	}
	params, err := values(ctx, s, m.Vars())
	return params, steps, examples, err
}

// digitsRecords reads the digits examples of the files pattern matches, in
// batches of batch examples.
func digitsRecords(pattern string, batch int) (dataset.Dataset, error) {
	src, err := dataset.TFRecordFiles([]string{pattern})
	if err != nil {
		return nil, err
	}
	p, err := dataset.NewExampleParser(dataset.FeatureSpec{"x": {Type: tf.Float, Shape: []int64{digits.Features}}, "y": {Type: tf.Int32}})
	if err != nil {
		return nil, err
	}
	return dataset.Batched(dataset.ParseExamples(src, p), batch, false), nil
}

// trainUnionOnDefault trains the MLP on the default strategy, step k on
// the k-th per-worker batch of each file together.
func trainUnionOnDefault(t *testing.T, d digits.Data, sizes [2]int) map[string][]float32 {
	t.Helper()
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	m, step, err := mlpStep(s)
	require.NoError(t, err)
	per := unevenGlobal / 2
	for k := 0; ; k++ {
		var x [][]float32
		var y []int32
		for w, start := range []int{0, sizes[0]} {
			lo, hi := start+k*per, min(start+(k+1)*per, start+sizes[w])
			if lo < hi {
				x, y = append(x, d.X[lo:hi]...), append(y, d.Y[lo:hi]...)
			}
		}
		if len(y) == 0 {
			break
		}
		xt, err := tf.NewTensor(x)
		require.NoError(t, err)
		yt, err := tf.NewTensor(y)
		require.NoError(t, err)
		_, err = s.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"x": xt, "y": yt}}, len(y))
		require.NoError(t, err)
	}
	params, err := values(ctx, s, m.Vars())
	require.NoError(t, err)
	return params
}

func mlpStep(s strategy.Strategy) (*nn.Sequential, strategy.Step, error) {
	var m *nn.Sequential
	err := s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 32, 1)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	step, err := s.Build(models.Spec, models.TrainStep(m, optimizer.NewSGD(optimizer.Constant(0.1))))
	return m, step, err
}

func values(ctx context.Context, s strategy.Strategy, vars []strategy.Variable) (map[string][]float32, error) {
	out := map[string][]float32{}
	for _, v := range vars {
		t, err := s.Value(ctx, v)
		if err != nil {
			return nil, err
		}
		out[v.Name()] = tensorutil.Float32s(t)
	}
	return out, nil
}

// A corrupt record in one worker's file fails every worker's step at once,
// each naming the worker and the corrupt record, rather than leaving the
// other worker to wait for the collective timeout.
func TestCorruptInputFailsEveryWorker(t *testing.T) {
	d, err := digits.Load()
	require.NoError(t, err)
	dir := t.TempDir()
	per := unevenGlobal / 2
	writeDigits(t, filepath.Join(dir, "a.tfrecord"), d, 0, 5*per)
	b := filepath.Join(dir, "b.tfrecord")
	writeDigits(t, b, d, 5*per, 10*per)
	raw, err := os.ReadFile(b)
	require.NoError(t, err)
	raw[len(raw)/2] ^= 0xff // a byte of a record in the third batch: its checksum fails
	require.NoError(t, os.WriteFile(b, raw, 0o644))

	start := time.Now()
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(failingTimeout)},
		func(w int, s *multiworker.Strategy) error {
			_, _, _, err := trainOnFiles(s, dir, false)
			return err
		})
	assert.Less(t, time.Since(start), failingTimeout/2, "the workers fail at once, not at the %v collective timeout", failingTimeout)
	for w, err := range errs {
		require.Error(t, err, "worker %d", w)
		t.Logf("worker %d: %v", w, err)
		assert.Contains(t, err.Error(), "the input of worker 1 failed", "worker %d", w)
		assert.Contains(t, err.Error(), "b.tfrecord", "worker %d names the corrupt file", w)
	}
}

// failingTimeout is the collective timeout of the tests whose workers fail
// at once rather than wait for a peer that never comes: what they measure,
// from before the workers start to their failure, includes starting and
// building the model, so it is long, so that they may take up to half of
// it, however loaded the machine, and still be told apart from a wait for
// the timeout.
const failingTimeout = 4 * time.Minute

// A worker whose input does not fit the step (a feature of another shape)
// fails every worker's step at once, naming the feature, the step and the
// worker.
func TestMisshapenInputFailsEveryWorker(t *testing.T) {
	start := time.Now()
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithStartupTimeout(30 * time.Second),
		multiworker.WithCollectiveTimeout(failingTimeout)},
		func(w int, s *multiworker.Strategy) error {
			_, step, err := mlpStep(s)
			if err != nil {
				return err
			}
			features := digits.Features
			if w == 1 {
				features-- // worker 1's file holds another shape
			}
			x, err := tf.NewTensor([][]float32{make([]float32, features)})
			if err != nil {
				return err
			}
			y, err := tf.NewTensor([]int32{1})
			if err != nil {
				return err
			}
			_, err = s.Run(context.Background(), step, &dataset.Batch{Replicas: []dataset.Element{{"x": x, "y": y}}, Counts: []int{1}, Step: 7})
			return err
		})
	assert.Less(t, time.Since(start), failingTimeout/2, "the workers fail at once, not at the %v collective timeout", failingTimeout)
	for w, err := range errs {
		require.Error(t, err, "worker %d", w)
		assert.Contains(t, err.Error(), `step 7: the input of worker 1: replica 0: input "x": shape [1 63], expected [-1 64]`, "worker %d", w)
	}
}
