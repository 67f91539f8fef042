// Command quickstart trains an MLP on the 8x8 handwritten digits shipped
// with tfdist with train.Fit under the Mirrored strategy on two logical
// CPUs, and prints its held-out accuracy: the README's first program.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

func main() {
	ctx := context.Background()
	s := must(mirrored.New(mirrored.WithLogicalCPUs(2))) // two replicas, each with a copy of every variable
	defer s.Close()
	var model *nn.Sequential
	if err := s.Scope(func(sc strategy.Scope) (err error) { // variables made here are mirrored
		model, err = nn.NewSequential(sc, "mlp", []int64{64}, 1, nn.Dense{Units: 64, Activation: nn.ReLU}, nn.Dense{Units: 10})
		return err
	}); err != nil {
		log.Fatal(err)
	}
	tr := must(train.Compile(s, model.Model, train.SparseCategoricalCrossentropy{FromLogits: true},
		optimizer.NewAdam(optimizer.Constant(0.01)), train.WithMetrics(train.SparseCategoricalAccuracy{})))
	trainSet, test := must(digits.Load()).Split(297, 1)
	ds := must(dataset.FromSlices(map[string]any{"x": trainSet.X, "y": trainSet.Y}))
	must(tr.Fit(ctx, dataset.Batched(dataset.Shuffle(ds, trainSet.Len(), 1), 64, false), // global batches of 64
		train.Epochs(10), train.WithCallbacks(train.NewProgressBar(os.Stdout))))
	val := must(dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y}))
	logs := must(tr.Evaluate(ctx, dataset.Batched(val, 64, false), 0))
	fmt.Printf("held-out accuracy %.1f%%\n", 100*logs["accuracy"])
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
