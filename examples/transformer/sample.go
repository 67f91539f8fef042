package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/train"
)

// generate samples -sample characters after -prompt: each is drawn from
// the softmax of the model's logits at the last position of the context
// (the last -seq-len characters), divided by -temperature, with a Go
// generator seeded by -seed. Every worker of a synchronous strategy runs
// the same predictions and gets the same logits, so all draw the same
// text.
func generate(ctx context.Context, tr *train.Trainer, o options) (string, error) {
	if o.sample == 0 {
		return "", nil
	}
	context := encode([]byte(o.prompt))
	if len(context) == 0 {
		context = []int32{newlineID}
	}
	rng := rand.New(rand.NewPCG(uint64(o.seed), 0x5eed))
	out := []int32{}
	for range o.sample {
		window := context[max(len(context)-o.seqLen, 0):]
		logits, err := nextLogits(ctx, tr, o, window)
		if err != nil {
			return "", fmt.Errorf("sample character %d: %w", len(out)+1, err)
		}
		next := draw(logits, o.temperature, rng)
		context, out = append(context, next), append(out, next)
	}
	return o.prompt + decode(out), nil
}

// nextLogits predicts the logits of window, left-aligned in one sequence
// (the causal mask keeps the padding after it from mattering), and
// returns those at its last character. The sequence is a partial global
// batch of one, which divides among any number of replicas.
func nextLogits(ctx context.Context, tr *train.Trainer, o options, window []int32) ([]float32, error) {
	row := make([]int32, o.seqLen)
	copy(row, window)
	ds, err := dataset.FromSlices(map[string]any{"x": [][]int32{row}})
	if err != nil {
		return nil, err
	}
	pred, err := tr.Predict(ctx, dataset.Batched(ds, o.globalBatch, false), 0)
	if err != nil {
		return nil, err
	}
	logits, ok := pred.Value().([][][]float32)
	if !ok || len(logits) != 1 || len(logits[0]) != o.seqLen {
		return nil, fmt.Errorf("logits of type %T shape %v, expected [1][%d][%d]float32", pred.Value(), pred.Shape(), o.seqLen, vocabSize)
	}
	return logits[0][len(window)-1], nil
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
