package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// GlobalAveragePooling1D averages [batch, steps, features] over the
// steps, giving [batch, features] (Keras' GlobalAveragePooling1D).
type GlobalAveragePooling1D struct{}

// Kind implements Spec.
func (GlobalAveragePooling1D) Kind() string { return "global_average_pooling1d" }

// Build implements Spec.
func (GlobalAveragePooling1D) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	return buildGlobalAverage("GlobalAveragePooling1D", 1, "[batch, steps, features]", in)
}

// GlobalAveragePooling2D averages NHWC inputs [batch, height, width,
// channels] over height and width, giving [batch, channels] (Keras'
// GlobalAveragePooling2D).
type GlobalAveragePooling2D struct{}

// Kind implements Spec.
func (GlobalAveragePooling2D) Kind() string { return "global_average_pooling2d" }

// Build implements Spec.
func (GlobalAveragePooling2D) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	return buildGlobalAverage("GlobalAveragePooling2D", 2, "[batch, height, width, channels]", in)
}

// buildGlobalAverage builds a mean over the spatial axes after the batch
// of inputs whose shape is want.
func buildGlobalAverage(layer string, spatial int, want string, in []int64) (Layer, []int64, error) {
	if len(in) != spatial+1 {
		return nil, nil, fmt.Errorf("%s: input shape %v, expected %s", layer, append([]int64{-1}, in...), want)
	}
	axes := make([]int32, spatial)
	for i := range axes {
		axes[i] = int32(i + 1)
	}
	return &globalAverage{in: in, axes: axes}, in[len(in)-1:], nil
}

type globalAverage struct {
	in   []int64
	axes []int32
}

func (l *globalAverage) Vars() []strategy.Variable { return nil }

func (l *globalAverage) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "global_average_pooling")
	return b.Mean(x, false, l.axes...), b.Err()
}
