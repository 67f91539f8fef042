package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/kerasbench"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/strategy"
)

// BenchmarkAgainstKeras measures the example's training step (its model,
// global batch 64, SGD with momentum 0.9) under Mirrored on 2 logical
// CPUs against the same model trained with Keras 3's model.fit under
// tf.distribute.MirroredStrategy on 2 logical CPUs
// (testdata/keras_resnet.py), on the same training examples, with the
// same TensorFlow thread pools on both sides (mirrored's defaults): -pairs
// measurements of -seconds on each side, in -turns turns alternating
// between the sides, each after 10 untimed steps (kerasbench.Run). It
// reports both sides' steps/s and examples/s (medians) and Go's steps/s
// over Keras's in each pair. Run with -benchtime 1x.
func BenchmarkAgainstKeras(b *testing.B) {
	const replicas = 2
	o := options{steps: 1000, globalBatch: 64, filters: 16, lr: 0.05, seed: 1}
	intra, inter := tfrt.DefaultThreads()
	s, err := mirrored.New(mirrored.WithLogicalCPUs(replicas), mirrored.WithThreads(intra, inter))
	require.NoError(b, err)
	defer s.Close()
	t, err := newTrainer(s, o)
	require.NoError(b, err)
	data, err := digits.Load()
	require.NoError(b, err)
	trainSet, _ := data.Split(heldOut, uint64(o.seed))

	dir := b.TempDir()
	kerasbench.WriteRaw(b, filepath.Join(dir, "x"), trainSet.X...)
	kerasbench.WriteRaw(b, filepath.Join(dir, "y"), trainSet.Y)
	setup := map[string]any{
		"replicas": replicas, "intra_op": intra, "inter_op": inter,
		"global_batch": o.globalBatch, "filters": o.filters, "lr": o.lr, "seed": o.seed,
		"x": filepath.Join(dir, "x"), "y": filepath.Join(dir, "y"), "n": trainSet.Len(),
	}
	for range b.N {
		kerasbench.Run(b, kerasbench.Config{
			Script: filepath.Join("testdata", "keras_resnet.py"), Setup: setup,
			Warmup:  10,
			PerStep: float64(o.globalBatch), Unit: "examples/s",
		}, t.measure(trainSet, o))
	}
}

// measure returns a kerasbench.Measure of t's training step on shuffled
// global batches of d, as fit runs it: each step's loss read back.
func (t *trainer) measure(d digits.Data, o options) kerasbench.Measure {
	return func(seconds float64, warmup int) (int, time.Duration, error) {
		ctx := context.Background()
		ds, err := dataset.FromSlices(map[string]any{"x": d.X, "y": d.Y})
		if err != nil {
			return 0, 0, err
		}
		dist, err := t.s.DistributeDataset(dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, d.Len(), uint64(o.seed)), -1), o.globalBatch, true))
		if err != nil {
			return 0, 0, err
		}
		var start time.Time
		step := 0
		for batch, err := range dist.All(ctx) {
			if err != nil {
				return 0, 0, err
			}
			res, err := t.s.Run(ctx, t.train, batch)
			if err != nil {
				return 0, 0, fmt.Errorf("step %d: %w", step, err)
			}
			if _, ok := strategy.TensorValue(res.Reduced("loss")).(float32); !ok {
				return 0, 0, fmt.Errorf("step %d: the loss is not a float32", step)
			}
			step++
			if step == warmup {
				start = time.Now()
			} else if elapsed := time.Since(start); step > warmup && elapsed.Seconds() >= seconds {
				return step - warmup, elapsed, nil
			}
		}
		return 0, 0, fmt.Errorf("the training data ended")
	}
}
