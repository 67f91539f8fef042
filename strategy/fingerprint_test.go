package strategy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tfdist/tfdist/strategy"
)

// Fingerprint tells apart models of the same global norm: one element
// negated, two swapped, one variable renamed or reshaped, or a float64
// variable holding the float32 one's values.
func TestFingerprintSeesEveryElement(t *testing.T) {
	model := func(edit func(*strategy.VariableValue)) []strategy.VariableValue {
		vs := []strategy.VariableValue{
			{Name: "dense/kernel", Shape: []int64{2, 2}, Float32: []float32{1, -2, 3, 4}},
			{Name: "dense/bias", Shape: []int64{2}, Float32: []float32{0.5, 0}},
		}
		edit(&vs[0])
		return vs
	}
	want := strategy.Fingerprint(model(func(*strategy.VariableValue) {}))
	assert.Regexp(t, `^[0-9a-f]{64}$`, want)
	assert.Equal(t, want, strategy.Fingerprint(model(func(*strategy.VariableValue) {})), "the same model")
	for what, edit := range map[string]func(*strategy.VariableValue){
		"negated":   func(v *strategy.VariableValue) { v.Float32[1] = 2 },
		"swapped":   func(v *strategy.VariableValue) { v.Float32[2], v.Float32[3] = v.Float32[3], v.Float32[2] },
		"renamed":   func(v *strategy.VariableValue) { v.Name = "dense/kernel_1" },
		"reshaped":  func(v *strategy.VariableValue) { v.Shape = []int64{4} },
		"as double": func(v *strategy.VariableValue) { v.Float32, v.Float64 = nil, []float64{1, -2, 3, 4} },
	} {
		vs := model(edit)
		assert.Equal(t, strategy.GlobalNorm(model(func(*strategy.VariableValue) {})), strategy.GlobalNorm(vs), what)
		assert.NotEqual(t, want, strategy.Fingerprint(vs), what)
	}
}
