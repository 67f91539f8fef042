package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/kerasbench"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/train"
)

// BenchmarkAgainstKeras measures the example's train.Fit at its defaults
// (2 blocks, width 64, 4 heads, global batch 32 × 64 characters, Adam
// with warmup and cosine decay, the loss logged) under Mirrored on 2
// logical CPUs against the same model trained with Keras 3's model.fit
// under tf.distribute.MirroredStrategy on 2 logical CPUs
// (testdata/keras_transformer.py), on the same training windows, with the
// same TensorFlow thread pools on both sides (mirrored's defaults): -pairs
// measurements of -seconds on each side, in -turns turns alternating
// between the sides, each after 5 untimed steps (kerasbench.Run). It
// reports both sides' steps/s and tokens (characters) per second
// (medians) and Go's steps/s over Keras's in each pair. Run with
// -benchtime 1x.
func BenchmarkAgainstKeras(b *testing.B) {
	const replicas = 2
	o, text, d := benchData(b)
	intra, inter, err := tfrt.DefaultThreads()
	require.NoError(b, err)
	s, err := mirrored.New(mirrored.WithLogicalCPUs(replicas), mirrored.WithThreads(intra, inter))
	require.NoError(b, err)
	defer s.Close()
	tr, err := compile(s, o)
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
		}, measure(tr, d.train))
	}
}

// benchData returns the example's defaults, the corpus of this Go
// installation's sources, and its batches.
func benchData(b *testing.B) (options, corpus, data) {
	o := defaults()
	dir, err := goSource()
	require.NoError(b, err)
	o.corpus = dir
	text, err := loadCorpus(o.corpus, int(o.trainBytes), int(o.evalBytes))
	require.NoError(b, err)
	d, err := batches(text, o)
	require.NoError(b, err)
	return o, text, d
}

// measure returns a kerasbench.Measure of tr.Fit on ds, the example's
// shuffled and repeated training batches, as model.fit runs on the Keras
// side: a callback starts the clock after the warm-up steps and stops
// training once the seconds have passed.
func measure(tr *train.Trainer, ds dataset.Dataset) kerasbench.Measure {
	return func(seconds float64, warmup int) (int, time.Duration, error) {
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
		if _, err := tr.Fit(context.Background(), ds, train.StepsPerEpoch(1<<30), train.WithCallbacks(clock)); err != nil {
			return 0, 0, err
		}
		return steps, elapsed, nil
	}
}

// BenchmarkDeterministic measures the cost of topology-invariant training
// on the example under Mirrored on 2 logical CPUs, at its defaults (32
// sequences a step, 4 a virtual shard) and with 256 sequences (32 a
// shard): steps/s with WithDeterministic(8) over steps/s without, in 3
// pairs of 20 s a side run in turn, each after 5 untimed steps; it
// reports the median ratio of each. Run with -benchtime 1x.
func BenchmarkDeterministic(b *testing.B) {
	for _, gb := range []int{32, 256} {
		o, text, d := benchData(b)
		if gb != o.globalBatch {
			o.globalBatch = gb
			var err error
			d, err = batches(text, o)
			require.NoError(b, err)
		}
		rates := map[bool]func() float64{}
		for _, det := range []bool{false, true} {
			opts := []mirrored.Option{mirrored.WithLogicalCPUs(2)}
			if det {
				opts = append(opts, mirrored.WithDeterministic(8))
			}
			s, err := mirrored.New(opts...)
			require.NoError(b, err)
			defer s.Close()
			tr, err := compile(s, o)
			require.NoError(b, err)
			run := measure(tr, d.train)
			rates[det] = func() float64 {
				steps, took, err := run(20, 5)
				require.NoError(b, err)
				return float64(steps) / took.Seconds()
			}
		}
		for range b.N {
			var ratios []float64
			for range 3 {
				plain := rates[false]()
				ratios = append(ratios, rates[true]()/plain)
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[1], fmt.Sprintf("gb%d_det/plain", gb))
		}
	}
}
