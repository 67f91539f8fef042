// Command digits is tfdist's own test bed: the digits classifier of
// package internal/classifier, a multi-layer perceptron (or, with -model
// lenet, a LeNet-style CNN) trained on the UCI handwritten digits shipped
// with tfdist under any strategy, with every feature the project tests end
// to end through real processes: checkpoints and restarts, parameter
// servers under fault injection, DP-SGD, robust aggregation, gradient
// compression, large-batch training, exports and soak statistics. `tfdist
// demo` and `tfdist bench` run the same code in-process, and `tfdist soak`
// runs this binary. It is not an example to copy: examples/classifier is
// the same model on the public API alone.
//
//	digits -strategy mirrored -devices 2
//	digits -strategy default -steps 200 -json
//	tfdist launch --workers 2 -- digits -strategy multiworker -devices 2
//	tfdist launch --chief --workers 2 --ps 2 -- digits -strategy ps -json
//	digits -strategy mirrored -devices 2 -export-dir /models/digits -export-version -1
//
// -export-dir writes the trained model as a SavedModel (package
// savedmodel) whose serving_default signature takes x (float32, [batch,
// 64]) and returns logits (float32, [batch, 10]); -export-version writes
// TensorFlow Serving's layout, DIR/N.
//
// With the same seed, data order and global batch, every synchronous
// strategy ends with the same model as the default strategy, up to float
// summation order: compare final_loss of the -json output, and the
// variables of -export-dir's SavedModels element by element. The workers
// of one job end with one model, bit for bit: their -json lines report the
// same params_sha256, a fingerprint of every element of every variable
// (param_l2, the variables' global norm, is only a summary).
package main

import (
	"os"

	"github.com/tfdist/tfdist/internal/classifier"
)

func main() {
	os.Exit(classifier.Main("digits", "mlp", os.Args[1:], os.Stdout, os.Stderr))
}
