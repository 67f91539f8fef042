package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/kerasbench"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
)

// BenchmarkAgainstKeras measures the example's training step at its
// defaults (2 blocks, width 64, 4 heads, global batch 32 × 64 characters,
// Adam with warmup and cosine decay) under Mirrored on 2 logical CPUs
// against the same model trained with Keras 3's model.fit under
// tf.distribute.MirroredStrategy on 2 logical CPUs
// (testdata/keras_transformer.py), on the same training windows, with the
// same TensorFlow thread pools on both sides (mirrored's defaults): -pairs
// measurements of -seconds on each side, in -turns turns alternating
// between the sides, each after 5 untimed steps (kerasbench.Run). It
// reports both sides' steps/s and tokens (characters) per second
// (medians) and Go's steps/s over Keras's in each pair. Run with
// -benchtime 1x.
func BenchmarkAgainstKeras(b *testing.B) {
	const replicas = 2
	o := defaults()
	dir, err := goSource()
	require.NoError(b, err)
	o.corpus = dir
	text, err := loadCorpus(o.corpus, int(o.trainBytes), int(o.evalBytes))
	require.NoError(b, err)
	intra, inter := tfrt.DefaultThreads()
	s, err := mirrored.New(mirrored.WithLogicalCPUs(replicas), mirrored.WithThreads(intra, inter))
	require.NoError(b, err)
	defer s.Close()
	t, err := newTrainer(s, o, io.Discard)
	require.NoError(b, err)

	tmp := b.TempDir()
	x, y := windows(text.train, o.seqLen)
	kerasbench.WriteRaw(b, filepath.Join(tmp, "x"), x...)
	kerasbench.WriteRaw(b, filepath.Join(tmp, "y"), y...)
	setup := map[string]any{
		"replicas": replicas, "intra_op": intra, "inter_op": inter,
		"global_batch": o.globalBatch, "seq_len": o.seqLen, "width": o.width, "heads": o.heads,
		"layers": o.layers, "vocab": vocabSize, "lr": o.lr, "warmup_steps": o.warmup,
		"decay_steps": max(o.steps-o.warmup, 1), "seed": o.seed,
		"x": filepath.Join(tmp, "x"), "y": filepath.Join(tmp, "y"), "n": len(x),
	}
	for range b.N {
		kerasbench.Run(b, kerasbench.Config{
			Script: filepath.Join("testdata", "keras_transformer.py"), Setup: setup,
			Warmup:  5,
			PerStep: float64(o.globalBatch * o.seqLen), Unit: "tokens/s",
		}, t.measure(text.train))
	}
}

// measure returns a kerasbench.Measure of t's training step on shuffled
// global batches of the windows of ids, as fit runs it (runTrain: each
// step's loss read back).
func (t *trainer) measure(ids []int32) kerasbench.Measure {
	return func(seconds float64, warmup int) (int, time.Duration, error) {
		ctx := context.Background()
		ds, n, err := t.sequences(ids, "training text")
		if err != nil {
			return 0, 0, err
		}
		dist, err := t.s.DistributeDataset(dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, n, uint64(t.o.seed)), -1), t.o.globalBatch, true))
		if err != nil {
			return 0, 0, err
		}
		var rep report
		var start time.Time
		step := 0
		for batch, err := range dist.All(ctx) {
			if err != nil {
				return 0, 0, err
			}
			if err := t.runTrain(ctx, &rep, batch); err != nil {
				return 0, 0, fmt.Errorf("step %d: %w", step, err)
			}
			step++
			if step == warmup {
				start = time.Now()
			} else if elapsed := time.Since(start); step > warmup && elapsed.Seconds() >= seconds {
				return step - warmup, elapsed, nil
			}
		}
		return 0, 0, fmt.Errorf("the training text ended")
	}
}
