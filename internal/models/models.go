// Package models holds the digits models of tfdist's examples and tests:
// one source for every strategy. Each is an nn.Sequential on the shipped
// digits (64 features, 10 classes).
package models

import (
	"fmt"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// Names lists the models New knows.
var Names = []string{"mlp", "lenet"}

// New builds the model called name in sc: "mlp", a ReLU hidden layer of
// hidden units, or "lenet", a LeNet-style CNN on the 8x8x1 images (two
// 3x3 convolutions of 6 and 16 filters, each followed by 2x2 max pooling,
// then dense layers of hidden units and 10 logits). seed seeds the
// initial weights.
func New(sc strategy.Scope, name string, hidden int, seed int64) (*nn.Sequential, error) {
	switch name {
	case "mlp":
		m, err := nn.NewMLP(sc, "mlp", []int{digits.Features, hidden, digits.Classes}, seed)
		if err != nil {
			return nil, err
		}
		return m.Sequential, nil
	case "lenet":
		return nn.NewSequential(sc, "lenet", []int64{digits.Features}, seed,
			nn.Reshape{Shape: []int64{8, 8, 1}},
			nn.Conv2D{Filters: 6, Kernel: 3, Padding: nn.Same, Activation: nn.ReLU},
			nn.MaxPool2D{Size: 2},
			nn.Conv2D{Filters: 16, Kernel: 3, Padding: nn.Same, Activation: nn.ReLU},
			nn.MaxPool2D{Size: 2},
			nn.Flatten{},
			nn.Dense{Units: hidden, Activation: nn.ReLU},
			nn.Dense{Units: digits.Classes},
		)
	}
	return nil, fmt.Errorf("model %q: expected one of %v", name, Names)
}
