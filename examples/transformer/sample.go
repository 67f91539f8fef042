package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/strategy"
)

// generate samples -sample characters after -prompt: each is drawn from
// the softmax of the model's logits at the last position of the context
// (the last -seq-len characters), divided by -temperature, with a Go
// generator seeded by -seed. Every worker runs the same steps; since
// every replica holds the same variables, all draw the same text.
func (t *trainer) generate(ctx context.Context) (string, error) {
	if t.o.sample == 0 {
		return "", nil
	}
	context := encode([]byte(t.o.prompt))
	if len(context) == 0 {
		context = []int32{newlineID}
	}
	rng := rand.New(rand.NewPCG(uint64(t.o.seed), 0x5eed))
	out := []int32{}
	for range t.o.sample {
		window := context[max(len(context)-t.o.seqLen, 0):]
		logits, err := t.nextLogits(ctx, window)
		if err != nil {
			return "", fmt.Errorf("sample character %d: %w", len(out)+1, err)
		}
		next := draw(logits, t.o.temperature, rng)
		context, out = append(context, next), append(out, next)
	}
	return t.o.prompt + decode(out), nil
}

// nextLogits runs the model on window, left-aligned in one sequence
// (the causal mask keeps the padding after it from mattering), on every
// replica, and returns the first local replica's logits at window's last
// character.
func (t *trainer) nextLogits(ctx context.Context, window []int32) ([]float32, error) {
	row := make([]int32, t.o.seqLen)
	copy(row, window)
	batch, err := t.oneRow(row)
	if err != nil {
		return nil, err
	}
	res, err := t.s.Run(ctx, t.logits, batch)
	if err != nil {
		return nil, err
	}
	logits, ok := strategy.TensorValue(res["logits"][0]).([][][]float32)
	if !ok || len(logits) != 1 || len(logits[0]) != t.o.seqLen {
		return nil, fmt.Errorf("logits of type %T, expected [1][%d][%d]float32", strategy.TensorValue(res["logits"][0]), t.o.seqLen, vocabSize)
	}
	return logits[0][len(window)-1], nil
}

// oneRow returns a step's input that gives every replica the sequence
// row: a batch of one example per replica, so that it divides among
// them.
func (t *trainer) oneRow(row []int32) (*dataset.Batch, error) {
	batch := &dataset.Batch{GlobalCount: t.s.NumReplicasInSync(), GlobalCountExact: true}
	for range t.s.NumLocalReplicas() {
		x, err := tf.NewTensor([][]int32{row})
		if err != nil {
			return nil, err
		}
		batch.Replicas = append(batch.Replicas, dataset.Element{"x": x})
		batch.Counts = append(batch.Counts, 1)
	}
	return batch, nil
}

// draw returns an id drawn from softmax(logits / temperature).
func draw(logits []float32, temperature float64, rng *rand.Rand) int32 {
	top := math.Inf(-1)
	for _, l := range logits {
		top = max(top, float64(l))
	}
	p := make([]float64, len(logits))
	sum := 0.0
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - top) / temperature)
		sum += p[i]
	}
	u := rng.Float64() * sum
	for i := range p {
		if u -= p[i]; u < 0 {
			return int32(i)
		}
	}
	return int32(len(p) - 1)
}
