package paramserver

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Loss scaling is refused when the step is built, naming the optimizer:
// workers update asynchronously, so no scale holds for a whole step.
func TestLossScaleIsRefused(t *testing.T) {
	s := newInProcess(t, 1, 1)
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = newMLP(sc, 8)
		return err
	}))
	ls, err := optimizer.NewLossScale(optimizer.NewSGD(nil))
	require.NoError(t, err)
	_, err = s.Build(models.Spec, models.TrainStep(m, ls))
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.ErrorContains(t, err, "optimizer *optimizer.LossScale scales the loss, which the parameter-server strategy does not support")
}
