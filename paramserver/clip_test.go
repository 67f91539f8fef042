package paramserver

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Under the parameter-server strategy, ClipByGlobalNorm takes the norm of a
// worker's whole gradient: a variable sharded over two ps tasks is clipped
// as one, together with the update's other variables, exactly as the same
// variable in one piece.
func TestClipByGlobalNormOverShards(t *testing.T) {
	s := newInProcess(t, 1, 2)
	ctx := testContext(t, time.Minute)
	const lr, clip = 0.5, 1.0
	var a, aWhole, b, bWhole strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		mk := func(name string, shape []int64, init any, opts ...strategy.VariableOption) strategy.Variable {
			if err != nil {
				return nil
			}
			var v strategy.Variable
			v, err = sc.Variable(name, tf.Float, shape, strategy.Constant(tensor(t, init)), opts...)
			return v
		}
		a = mk("a", []int64{6, 2}, table(6, 2), strategy.WithPartitioner(FixedShards(2)))
		aWhole = mk("a_whole", []int64{6, 2}, table(6, 2))
		b = mk("b", []int64{3}, []float32{1, 2, 3})
		bWhole = mk("b_whole", []int64{3}, []float32{1, 2, 3})
		return err
	}))
	require.Equal(t, 2, psVar(a).NumShards())
	spec := strategy.InputSpec{"ga": {DType: tf.Float, Shape: []int64{6, 2}}, "gb": {DType: tf.Float, Shape: []int64{3}}}
	build := func(a, b strategy.Variable) *Function {
		opt, err := optimizer.ClipByGlobalNorm(optimizer.NewSGD(optimizer.Constant(lr)), clip)
		require.NoError(t, err)
		fn, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			sc := rc.Scope()
			loss := op.Add(sc.SubScope("loss"),
				graphutil.SumAll(sc.SubScope("a"), op.Mul(sc.SubScope("mul_a"), strategy.MustRead(rc, a), in["ga"])),
				graphutil.SumAll(sc.SubScope("b"), op.Mul(sc.SubScope("mul_b"), strategy.MustRead(rc, b), in["gb"])))
			return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{a, b})
		})
		require.NoError(t, err)
		return fn
	}
	ga := [][]float32{{1, -2}, {0, 3}, {0.5, 0}, {0, 0}, {-4, 1}, {2, 2}}
	gb := []float32{0.5, -1, 2}
	in := Feed(dataset.Element{"ga": tensor(t, ga), "gb": tensor(t, gb)})
	c := newCoordinator(t, s)
	for _, fn := range []*Function{build(a, b), build(aWhole, bWhole)} {
		_, err := c.Schedule(fn, in)
		require.NoError(t, err)
	}
	require.NoError(t, c.Join(ctx))

	var sq float64
	for _, row := range ga {
		for _, g := range row {
			sq += float64(g) * float64(g)
		}
	}
	for _, g := range gb {
		sq += float64(g) * float64(g)
	}
	scale := clip / math.Max(math.Sqrt(sq), clip)
	require.Less(t, scale, 0.5, "the gradient is clipped")
	value := func(v strategy.Variable) any {
		x, err := s.Value(ctx, v)
		require.NoError(t, err)
		return x.Value()
	}
	assert.Equal(t, value(aWhole), value(a), "the sharded variable is updated as the whole one")
	assert.Equal(t, value(bWhole), value(b))
	for i, row := range value(a).([][]float32) {
		for j, x := range row {
			assert.InDelta(t, float64(table(6, 2)[i][j])-lr*scale*float64(ga[i][j]), x, 1e-5, "a[%d][%d]", i, j)
		}
	}
}
