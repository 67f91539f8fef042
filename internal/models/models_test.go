package models_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// trainDigits trains model under policy p with SGD for steps batches of
// 64 training examples and returns its accuracy on the held-out ones.
func trainDigits(t *testing.T, model string, p nn.Policy, steps int, train, test digits.Data) float64 {
	t.Helper()
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, model, 64, 1)
		return err
	}))
	m = m.WithPolicy(p)
	opt, err := models.OptimizerFor(p, optimizer.NewSGD(optimizer.Constant(0.1)))
	require.NoError(t, err)
	trainStep, err := s.Build(models.Spec, models.TrainStep(m, opt))
	require.NoError(t, err)
	evalStep, err := s.Build(models.Spec, models.EvalStep(m, nil))
	require.NoError(t, err)
	feed := func(d digits.Data, lo, hi int) []map[string]*tf.Tensor {
		x, err := tf.NewTensor(d.X[lo:hi])
		require.NoError(t, err)
		y, err := tf.NewTensor(d.Y[lo:hi])
		require.NoError(t, err)
		return []map[string]*tf.Tensor{{"x": x, "y": y}}
	}
	const batch = 64
	for k := range steps {
		lo := k * batch % (train.Len() - batch)
		_, err := s.RunReplicas(ctx, trainStep, feed(train, lo, lo+batch), batch)
		require.NoError(t, err)
	}
	res, err := s.RunReplicas(ctx, evalStep, feed(test, 0, test.Len()), test.Len())
	require.NoError(t, err)
	return float64(res["correct"][0].Value().(float32)) / float64(test.Len())
}

// Mixed precision trains the digits models to within 1 point of float32's
// held-out accuracy (597 examples): bfloat16 the MLP and LeNet, float16
// with loss scaling the MLP. (LeNet in float16 takes seconds more: this
// CPU has no float16 convolutions in oneDNN, and TensorFlow falls back
// to Eigen's.)
func TestMixedPrecisionMatchesFloat32Accuracy(t *testing.T) {
	data, err := digits.Load()
	require.NoError(t, err)
	train, test := data.Split(597, 1)
	for _, c := range []struct {
		model    string
		steps    int
		policies []nn.Policy
	}{
		{"mlp", 300, []nn.Policy{nn.MixedBfloat16, nn.MixedFloat16}},
		{"lenet", 500, []nn.Policy{nn.MixedBfloat16}},
	} {
		want := trainDigits(t, c.model, nn.Float32, c.steps, train, test)
		require.Greater(t, want, 0.9, "%s float32 accuracy", c.model)
		for _, p := range c.policies {
			got := trainDigits(t, c.model, p, c.steps, train, test)
			t.Logf("%s: float32 %.4f, %s %.4f", c.model, want, p, got)
			assert.InDelta(t, want, got, 0.01, "%s under %s", c.model, p)
		}
	}
}

// The float16 step of an optimizer without loss scaling fails to build,
// naming the policy.
func TestFloat16WithoutLossScalingIsRefused(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 8, 1)
		return err
	}))
	_, err = s.Build(models.Spec, models.TrainStep(m.WithPolicy(nn.MixedFloat16), optimizer.NewSGD(nil)))
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.ErrorContains(t, err, "mixed-precision policy mixed_float16 with optimizer *optimizer.SGD, which does not scale the loss")
}
