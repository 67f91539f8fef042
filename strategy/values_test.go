package strategy_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/strategy"
)

// TestReadVariables reads float32 and float64 variables of a two-replica
// strategy as Go slices with their shapes, in the order asked, and their
// global norm; other types are refused by name.
func TestReadVariables(t *testing.T) {
	ctx := context.Background()
	e, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer e.Close()
	var w, d, n strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		if w, err = sc.Variable("w", tf.Float, []int64{2, 2}, strategy.Constant(tensor(t, [][]float32{{1, 2}, {3, 4}}))); err != nil {
			return err
		}
		if d, err = sc.Variable("d", tf.Double, []int64{3}, strategy.Constant(tensor(t, []float64{0.5, -1e-300, 2}))); err != nil {
			return err
		}
		n, err = sc.Variable("n", tf.Int64, nil, strategy.Zeros())
		return err
	}))

	got, err := strategy.ReadVariables(ctx, e, []strategy.Variable{d, w})
	require.NoError(t, err)
	require.Equal(t, []strategy.VariableValue{
		{Name: "d", Shape: []int64{3}, Float64: []float64{0.5, -1e-300, 2}},
		{Name: "w", Shape: []int64{2, 2}, Float32: []float32{1, 2, 3, 4}},
	}, got)
	require.InDelta(t, math.Sqrt(1+4+9+16+0.25+4), strategy.GlobalNorm(got), 1e-12)
	require.Zero(t, strategy.GlobalNorm(nil))

	_, err = strategy.ReadVariables(ctx, e, []strategy.Variable{w, n})
	require.ErrorContains(t, err, `variable "n" has dtype`)
	require.ErrorContains(t, err, "expected float32 or float64")
}

// TensorValue reads a step's fetched outputs as Go values, and gives nil
// for the nil tensor that Reduced returns for an unknown name.
func TestTensorValue(t *testing.T) {
	e, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer e.Close()
	step, err := e.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 2}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sc := r.Scope()
			sum := op.Sum(sc, in["x"], op.Const(sc.SubScope("axes"), []int32{0, 1}))
			return strategy.Outputs{"rows": in["x"]}, r.ReduceOutput("sum", strategy.Sum, sum)
		})
	require.NoError(t, err)
	feeds := []map[string]*tf.Tensor{
		{"x": tensor(t, [][]float32{{1, 2}})},
		{"x": tensor(t, [][]float32{{3, 4}, {5, 6}})},
	}
	out, err := e.RunReplicas(context.Background(), step, feeds, 3)
	require.NoError(t, err)
	require.Equal(t, float32(21), strategy.TensorValue(out.Reduced("sum")))
	require.Equal(t, [][]float32{{3, 4}, {5, 6}}, strategy.TensorValue(out["rows"][1]))
	require.Nil(t, strategy.TensorValue(out.Reduced("no such output")))
}

// MaxDiff finds the element that differs most at its variable's scale,
// and refuses readings of other variables or sizes.
func TestMaxDiff(t *testing.T) {
	a := []strategy.VariableValue{{Name: "w", Float32: []float32{10, -20, 0}}, {Name: "b", Float64: []float64{0.001, 0.002}}}
	b := []strategy.VariableValue{{Name: "w", Float32: []float32{10, -20, 0.01}}, {Name: "b", Float64: []float64{0.001, 0.0021}}}
	diff, name, i := strategy.MaxDiff(a, b)
	assert.InDelta(t, 0.05, diff, 1e-9, "0.0001 at the scale 0.002 of b")
	assert.Equal(t, "b", name)
	assert.Equal(t, 1, i)
	diff, _, _ = strategy.MaxDiff(a, a)
	assert.Zero(t, diff)
	diff, _, _ = strategy.MaxDiff(a, a[:1])
	assert.True(t, math.IsInf(diff, 1))
	diff, name, _ = strategy.MaxDiff(a, []strategy.VariableValue{a[0], {Name: "c", Float64: []float64{0.001, 0.002}}})
	assert.True(t, math.IsInf(diff, 1))
	assert.Equal(t, "b", name)
	nan := []strategy.VariableValue{a[0], {Name: "b", Float64: []float64{math.NaN(), 0.002}}}
	diff, _, _ = strategy.MaxDiff(a, nan)
	assert.True(t, math.IsInf(diff, 1))
}

func tensor(t *testing.T, v any) *tf.Tensor {
	t.Helper()
	x, err := tf.NewTensor(v)
	require.NoError(t, err)
	return x
}
