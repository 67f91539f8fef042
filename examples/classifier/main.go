// Command classifier trains a multi-layer perceptron on the UCI handwritten
// digits shipped with tfdist, under any strategy, and reports the held-out
// accuracy. It is the program behind `make demo`.
//
//	classifier -strategy mirrored -devices 2
//	classifier -strategy default -steps 200 -json
//	tfdist launch --workers 2 -- classifier -strategy multiworker -devices 2
//	classifier -strategy mirrored -devices 2 -export-dir /models/digits -export-version -1
//
// -export-dir writes the trained model as a SavedModel (package
// savedmodel) whose serving_default signature takes x (float32, [batch,
// 64]) and returns logits (float32, [batch, 10]); -export-version writes
// TensorFlow Serving's layout, DIR/N.
//
// With the same seed, data order and global batch, every synchronous
// strategy ends with the same model as the default strategy, up to float
// summation order: compare final_loss and param_l2 of the -json output.
package main

import (
	"os"

	"github.com/tfdist/tfdist/internal/classifier"
)

func main() {
	os.Exit(classifier.Main("classifier", "mlp", os.Args[1:], os.Stdout, os.Stderr))
}
