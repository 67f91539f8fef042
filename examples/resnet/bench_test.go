package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/kerasbench"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/train"
)

// BenchmarkAgainstKeras measures the example's train.Fit (its model,
// global batch 64, SGD with momentum 0.9, the loss and accuracy logged)
// under Mirrored on 2 logical CPUs against the same model trained with
// Keras 3's model.fit (the same loss and metric) under
// tf.distribute.MirroredStrategy on 2 logical CPUs
// (testdata/keras_resnet.py), on the same training examples, with the
// same TensorFlow thread pools on both sides (mirrored's defaults): -pairs
// measurements of -seconds on each side, in -turns turns alternating
// between the sides, each after 10 untimed steps (kerasbench.Run). It
// reports both sides' steps/s and examples/s (medians) and Go's steps/s
// over Keras's in each pair. Run with -benchtime 1x.
func BenchmarkAgainstKeras(b *testing.B) {
	const replicas = 2
	o := options{epochs: 10, stepsPerEpoch: 100, globalBatch: 64, filters: 16, lr: 0.05, seed: 1}
	intra, inter, err := tfrt.DefaultThreads()
	require.NoError(b, err)
	s, err := mirrored.New(mirrored.WithLogicalCPUs(replicas), mirrored.WithThreads(intra, inter))
	require.NoError(b, err)
	defer s.Close()
	tr, err := compile(s, o)
	require.NoError(b, err)
	d, err := digits.Load()
	require.NoError(b, err)
	trainSet, _ := d.Split(heldOut, uint64(o.seed))

	dir := b.TempDir()
	kerasbench.WriteRaw(b, filepath.Join(dir, "x"), trainSet.X...)
	kerasbench.WriteRaw(b, filepath.Join(dir, "y"), trainSet.Y)
	setup := map[string]any{
		"replicas": replicas, "intra_op": intra, "inter_op": inter,
		"global_batch": o.globalBatch, "filters": o.filters, "lr": o.lr, "decay_steps": o.epochs * o.stepsPerEpoch, "seed": o.seed,
		"x": filepath.Join(dir, "x"), "y": filepath.Join(dir, "y"), "n": trainSet.Len(),
	}
	for range b.N {
		kerasbench.Run(b, kerasbench.Config{
			Script: filepath.Join("testdata", "keras_resnet.py"), Setup: setup,
			Warmup:  10,
			PerStep: float64(o.globalBatch), Unit: "examples/s",
		}, measure(tr, o))
	}
}

// measure returns a kerasbench.Measure of tr.Fit on shuffled global
// batches of the training set, as model.fit runs on the Keras side: a
// callback starts the clock after the warm-up steps and stops training
// once the seconds have passed.
func measure(tr *train.Trainer, o options) kerasbench.Measure {
	return func(seconds float64, warmup int) (int, time.Duration, error) {
		trainSet, _, _, err := data(o)
		if err != nil {
			return 0, 0, err
		}
		var start time.Time
		var steps int
		var elapsed time.Duration
		clock := &train.LambdaCallback{BatchEnd: func(_ context.Context, r *train.Run, _ int, _ train.Logs) error {
			switch n := int(r.Steps()); {
			case n == warmup:
				start = time.Now()
			case n > warmup && time.Since(start).Seconds() >= seconds:
				steps, elapsed = n-warmup, time.Since(start)
				r.StopTraining()
			}
			return nil
		}}
		if _, err := tr.Fit(context.Background(), trainSet, train.StepsPerEpoch(1<<30), train.WithCallbacks(clock)); err != nil {
			return 0, 0, err
		}
		return steps, elapsed, nil
	}
}
