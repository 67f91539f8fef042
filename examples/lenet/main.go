// Command lenet trains a LeNet-style convolutional network on the 8x8
// UCI handwritten digits shipped with tfdist, under any strategy, with the
// classifier's flags and -json output. The model (internal/models) is one
// source for every strategy: two 3x3 convolutions with 2x2 max pooling,
// then two dense layers.
//
//	lenet -strategy mirrored -devices 4 -steps 300 -json
//	tfdist launch --workers 2 -- lenet -strategy multiworker -devices 2
//	tfdist launch --chief --workers 2 --ps 2 -- lenet -strategy ps -optimizer adam -lr 0.001 -steps 3000
//
// The last, asynchronous, reaches about 97% held-out accuracy. With
// -export-dir the trained network is written as a SavedModel, the
// classifier's signature: x (float32, [batch, 64]) to logits (float32,
// [batch, 10]).
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
	os.Exit(classifier.Main("lenet", "lenet", os.Args[1:], os.Stdout, os.Stderr))
}
