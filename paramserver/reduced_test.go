package paramserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// A worker's step is one replica, not in sync with the others: its reduced
// outputs, Sum and Mean alike, are the worker's own values, returned with
// its other outputs.
func TestReducedOutputsAreTheWorkersValue(t *testing.T) {
	ctx := testContext(t, time.Minute)
	s := newInProcess(t, 2, 1)
	c := newCoordinator(t, s)
	fn, err := s.Build(reducedtest.Spec, reducedtest.Step)
	require.NoError(t, err)
	assert.Equal(t, []string{"cols", "cols_mean", "cols_sum", "loss", "loss_mean", "loss_sum"}, fn.OutputNames())
	var rvs []*RemoteValue
	for k := range 4 {
		rv, err := c.Schedule(fn, Feed(dataset.Element{"x": tensor(t, reducedtest.Input(k, k))}))
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	for k, rv := range rvs {
		out, err := rv.Get(ctx)
		require.NoError(t, err)
		for name, red := range reducedtest.Reduced {
			assert.Equal(t, tensorutil.Float32s(out[red.Of]), tensorutil.Float32s(out[name]), "step %d: %s", k, name)
		}
		// The loss is the mean over the worker's batch; the columns its sums.
		x := reducedtest.Input(k, k)
		var total float32
		for _, row := range x {
			for _, v := range row {
				total += v
			}
		}
		assert.InDelta(t, total/float32(len(x)), out["loss_sum"].Value(), 1e-4, "step %d", k)
	}
}

// The parameter-server strategy refuses bad declarations as the in-graph
// engine does, naming the output.
func TestReduceOutputBadInputOnPS(t *testing.T) {
	s := newInProcess(t, 1, 1)
	_, err := s.Build(reducedtest.Spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{"x": in["x"]}, r.ReduceOutput("x", strategy.Sum, in["x"])
	})
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.Contains(t, err.Error(), `output "x"`)
	assert.Contains(t, err.Error(), "both returns it and declares it")

	_, err = s.Build(reducedtest.Spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return nil, r.ReduceOutput("loss", strategy.ReduceOp(-1), in["x"])
	})
	require.ErrorAs(t, err, &be)
	assert.Contains(t, err.Error(), `ReduceOutput "loss": reduce op ReduceOp(-1)`)
}
