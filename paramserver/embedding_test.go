package paramserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

func table(rows, cols int) [][]float32 {
	out := make([][]float32, rows)
	for i := range out {
		out[i] = make([]float32, cols)
		for j := range out[i] {
			out[i][j] = float32(10*i + j)
		}
	}
	return out
}

// One sparse step on an embedding table sharded over two ps tasks changes
// exactly the rows it looked up — a row looked up twice twice as much — and
// no other row, on either shard; the same holds for a table in one piece.
func TestSparseStepChangesOnlyLookedUpRows(t *testing.T) {
	s := newInProcess(t, 2, 2)
	ctx := testContext(t, time.Minute)
	const lr = 0.5
	w0 := []float32{1, -2, 3}
	var sharded, whole, w strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		if sharded, err = sc.Variable("user_emb", tf.Float, []int64{10, 3}, strategy.Constant(tensor(t, table(10, 3))), strategy.WithPartitioner(FixedShards(2))); err != nil {
			return err
		}
		if whole, err = sc.Variable("item_emb", tf.Float, []int64{6, 3}, strategy.Constant(tensor(t, table(6, 3)))); err != nil {
			return err
		}
		w, err = sc.Variable("w", tf.Float, []int64{3}, strategy.Constant(tensor(t, w0)))
		return err
	}))
	require.Equal(t, []ShardInfo{{s.ps[0], 0, 5}, {s.ps[1], 5, 5}}, psVar(sharded).Shards())
	spec := strategy.InputSpec{"users": {DType: tf.Int64, Shape: []int64{-1}}, "items": {DType: tf.Int32, Shape: []int64{-1}}}
	fn, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		u, err := rc.Lookup(sharded, in["users"])
		if err != nil {
			return nil, err
		}
		i, err := rc.Lookup(whole, in["items"])
		if err != nil {
			return nil, err
		}
		sc := rc.Scope()
		both := op.Add(sc.SubScope("both"), u, i)
		perExample := op.Sum(sc.SubScope("dot"), op.Mul(sc.SubScope("mul"), both, strategy.MustRead(rc, w)), op.Const(sc.SubScope("axis"), int32(1)))
		loss := rc.AverageLoss(perExample)
		return strategy.Outputs{"loss": loss, "rows": u}, rc.Minimize(optimizer.NewSGD(optimizer.Constant(lr)), loss,
			[]strategy.Variable{sharded, whole, w}, strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: lr}))
	})
	require.NoError(t, err)
	assert.True(t, fn.Updates())
	c := newCoordinator(t, s)
	users := []int64{1, 7, 7, 3} // rows 1 and 3 on shard 0, row 7 (twice) on shard 1
	items := []int32{0, 0, 5, 2}
	rv, err := c.Schedule(fn, Feed(dataset.Element{"users": tensor(t, users), "items": tensor(t, items)}))
	require.NoError(t, err)
	out, err := rv.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, [][]float32{table(10, 3)[1], table(10, 3)[7], table(10, 3)[7], table(10, 3)[3]}, out["rows"].Value(),
		"the lookup gathers each id's row from its shard")
	assert.True(t, rv.Info().Applied)

	// d loss / d row = w0 / batch for each occurrence of the row.
	check := func(v strategy.Variable, rows int, looked map[int]int) {
		got, err := s.Value(ctx, v)
		require.NoError(t, err)
		before := table(rows, 3)
		for r, row := range got.Value().([][]float32) {
			for j := range row {
				want := before[r][j] - lr*float32(looked[r])*w0[j]/float32(len(users))
				assert.InDelta(t, want, row[j], 1e-5, "%s row %d col %d (looked up %d times)", v.Name(), r, j, looked[r])
			}
		}
	}
	check(sharded, 10, map[int]int{1: 1, 7: 2, 3: 1})
	check(whole, 6, map[int]int{0: 2, 5: 1, 2: 1})
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, applied)
}

// Minimize rejects, at Build, a looked-up variable with neither a sparse
// nor a dense optimizer, a variable both read and looked up, and gradient
// accumulation.
func TestMinimizeMisuse(t *testing.T) {
	s := newInProcess(t, 1, 1)
	var emb strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		emb, err = sc.Variable("emb", tf.Float, []int64{4, 2}, strategy.Zeros())
		return err
	}))
	spec := strategy.InputSpec{"ids": {DType: tf.Int32, Shape: []int64{-1}}}
	opt := optimizer.NewSGD(nil)
	_, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		rows, err := rc.Lookup(emb, in["ids"])
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(rows)
		return strategy.Outputs{"loss": loss}, rc.Minimize(nil, loss, []strategy.Variable{emb})
	})
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.ErrorContains(t, err, "Minimize: nil optimizer")
	_, err = s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		rows, err := rc.Lookup(emb, in["ids"])
		if err != nil {
			return nil, err
		}
		sc := rc.Scope()
		loss := rc.AverageLoss(op.Add(sc.SubScope("add"), rows, op.Sum(sc.SubScope("sum"), strategy.MustRead(rc, emb), op.Const(sc.SubScope("axis"), int32(0)))))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{emb}, strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: 0.1}))
	})
	assert.ErrorContains(t, err, `both reads and looks up variable "emb"`)
	_, err = s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		_, err := rc.Lookup(emb, op.Cast(rc.Scope().SubScope("f"), in["ids"], tf.Float))
		return nil, err
	})
	assert.ErrorContains(t, err, "ids are float32, expected int32 or int64")
	for k, want := range map[int]string{
		4: "WithAccumulation(4): gradient accumulation is not supported under the parameter-server strategy",
		0: "WithAccumulation(0): expected at least 1",
	} {
		_, err = s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			loss := rc.AverageLoss(op.Sum(rc.Scope().SubScope("sum"), strategy.MustRead(rc, emb), op.Const(rc.Scope().SubScope("axis"), int32(0))))
			return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{emb}, strategy.WithAccumulation(k))
		})
		require.ErrorAs(t, err, &be)
		assert.ErrorContains(t, err, want)
	}
}

// ApplyGradients refuses, at Build, gradients that do not match the
// variables in number, type or shape, and gradient accumulation.
func TestApplyGradientsMisuse(t *testing.T) {
	s := newInProcess(t, 1, 1)
	var emb strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		emb, err = sc.Variable("emb", tf.Float, []int64{4, 2}, strategy.Zeros())
		return err
	}))
	spec := strategy.InputSpec{"g": {DType: tf.Float, Shape: []int64{3, 2}}}
	opt := optimizer.NewSGD(nil)
	for want, apply := range map[string]func(rc strategy.Replica, g tf.Output) error{
		"ApplyGradients: 2 gradients for 1 variables": func(rc strategy.Replica, g tf.Output) error {
			return rc.ApplyGradients(opt, []tf.Output{g, g}, []strategy.Variable{emb})
		},
		`ApplyGradients: the gradient of "emb" has shape [3 2]; expected the variable's [4 2]`: func(rc strategy.Replica, g tf.Output) error {
			return rc.ApplyGradients(opt, []tf.Output{g}, []strategy.Variable{emb})
		},
		`ApplyGradients: the gradient of "emb" is float64; expected the variable's float32`: func(rc strategy.Replica, g tf.Output) error {
			return rc.ApplyGradients(opt, []tf.Output{op.Cast(rc.Scope().SubScope("cast"), g, tf.Double)}, []strategy.Variable{emb})
		},
		"ApplyGradients: WithAccumulation(2): gradient accumulation is not supported": func(rc strategy.Replica, g tf.Output) error {
			return rc.ApplyGradients(opt, []tf.Output{g}, []strategy.Variable{emb}, strategy.WithAccumulation(2))
		},
	} {
		_, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return nil, apply(rc, in["g"])
		})
		var be *strategy.BuildError
		require.ErrorAs(t, err, &be, want)
		assert.ErrorContains(t, err, want)
	}
}
