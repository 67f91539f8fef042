package ingraph_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// checkReduced asserts that every reduced output of reducedtest.Step, from
// the step's own run, equals Reduce of the per-replica output and the value
// computed in Go.
func checkReduced(t *testing.T, got map[string]reducedtest.Values) {
	t.Helper()
	require.Len(t, got, len(reducedtest.Reduced))
	for name, v := range got {
		assert.InDeltaSlice(t, v.Reduce, v.InRun, 1e-4, "%s: in the run vs Reduce", name)
		assert.InDeltaSlice(t, v.Want, v.InRun, 1e-4, "%s: in the run vs computed in Go", name)
	}
}

// A step's reduced outputs, computed in its own run, equal Reduce of its
// per-replica outputs: on the default strategy, on 3 replicas reducing on
// one device, and on 2 replicas whose reductions are packed.
func TestReducedOutputsEqualReduce(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	got, err := reducedtest.Run(ctx, def, 0, 3)
	require.NoError(t, err)
	checkReduced(t, got)

	for _, c := range []struct {
		n   int
		cdo strategy.CrossDeviceOps
	}{
		{3, ingraph.ReductionToOneDevice{}},
		{2, ingraph.Packed{Inner: ingraph.ReductionToOneDevice{}, BytesPerPack: 1 << 20}},
	} {
		t.Run(fmt.Sprintf("%d_%T", c.n, c.cdo), func(t *testing.T) {
			got, err := reducedtest.Run(ctx, local(t, c.n, c.cdo), 0, 3)
			require.NoError(t, err)
			checkReduced(t, got)
		})
	}
}

// A step may return nothing but reduced outputs: the Result holds one
// tensor per reduced output, and the step's output names list them.
func TestStepWithOnlyReducedOutputs(t *testing.T) {
	e := local(t, 2, nil)
	step, err := e.Build(vecSpec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := r.Scope()
		sum := op.Sum(s.SubScope("sum"), in["x"], op.Const(s.SubScope("axis"), int32(0)))
		return nil, r.ReduceOutput("total", strategy.Sum, sum)
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"total"}, step.OutputNames())
	assert.Equal(t, []string{"total"}, step.ReducedOutputNames())
	res, err := e.RunReplicas(ctx, step, feeds(t, 2, 2), 4) // {1,2}, {3,4}
	require.NoError(t, err)
	require.Len(t, res["total"], 1)
	assert.Equal(t, float32(10), res.Reduced("total").Value())
	assert.Nil(t, res.Reduced("missing"))
}

// Bad declarations are build errors that name the output and what is
// wrong with it.
func TestReduceOutputBadInput(t *testing.T) {
	e := local(t, 2, nil)
	build := func(fn func(r strategy.Replica, x tf.Output) (strategy.Outputs, error)) error {
		_, err := e.Build(vecSpec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return fn(r, op.Sum(r.Scope().SubScope("sum"), in["x"], op.Const(r.Scope().SubScope("axis"), int32(0))))
		})
		return err
	}
	for _, c := range []struct {
		name string
		fn   func(r strategy.Replica, x tf.Output) (strategy.Outputs, error)
		want []string
	}{
		{"unknown op", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			return nil, r.ReduceOutput("loss", strategy.ReduceOp(7), x)
		}, []string{`"loss"`, "ReduceOp(7)", "Sum or strategy.Mean"}},
		{"duplicate", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			if err := r.ReduceOutput("loss", strategy.Sum, x); err != nil {
				return nil, err
			}
			return nil, r.ReduceOutput("loss", strategy.Mean, x)
		}, []string{`"loss"`, "declared twice"}},
		{"empty name", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			return nil, r.ReduceOutput("", strategy.Sum, x)
		}, []string{"empty output name"}},
		{"no op", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			return nil, r.ReduceOutput("loss", strategy.Sum, tf.Output{})
		}, []string{`"loss"`, "no op"}},
		{"clash", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			return strategy.Outputs{"loss": x}, r.ReduceOutput("loss", strategy.Sum, x)
		}, []string{`output "loss"`, "both returns it and declares it"}},
		{"replica 1 declares none", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			if r.ReplicaID() == 1 {
				return nil, nil
			}
			return nil, r.ReduceOutput("loss", strategy.Sum, x)
		}, []string{"replica 1", "[]", "replica 0 declares [loss]"}},
		{"replica 1 declares more", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			if r.ReplicaID() == 1 {
				if err := r.ReduceOutput("extra", strategy.Sum, x); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}, []string{"replica 1", "[extra]", "replica 0 declares none"}},
		{"ops differ", func(r strategy.Replica, x tf.Output) (strategy.Outputs, error) {
			return nil, r.ReduceOutput("loss", strategy.ReduceOp(r.ReplicaID()), x)
		}, []string{"replica 1", `"loss"`, "MEAN", "replica 0 with SUM"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := build(c.fn)
			var be *strategy.BuildError
			require.ErrorAs(t, err, &be)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
