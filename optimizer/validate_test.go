package optimizer_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// Bad hyperparameters and schedules are refused by the constructors with an
// error naming the field, the value and what is expected.
func TestConstructorsRefuseBadInput(t *testing.T) {
	cases := []struct {
		name  string
		build func() error
		want  []string
	}{
		{"negative weight decay", func() error { _, err := optimizer.NewAdamW(nil, optimizer.WithWeightDecay(-0.1)); return err },
			[]string{"AdamW", "weight decay is -0.1, want a finite value >= 0"}},
		{"NaN weight decay", func() error { _, err := optimizer.NewLAMB(nil, optimizer.WithWeightDecay(nan)); return err },
			[]string{"LAMB", "weight decay is NaN"}},
		{"beta of 1", func() error { _, err := optimizer.NewLAMB(nil, optimizer.WithBetas(1, 0.999)); return err },
			[]string{"beta1 is 1, want a value in [0, 1)"}},
		{"negative epsilon", func() error { _, err := optimizer.NewAdamW(nil, optimizer.WithEpsilon(-1e-7)); return err },
			[]string{"epsilon is -1e-07"}},
		{"momentum above 1", func() error { _, err := optimizer.NewLARS(nil, optimizer.WithMomentum(1.5)); return err },
			[]string{"LARS", "momentum is 1.5, want a value in [0, 1]"}},
		{"infinite trust coefficient", func() error {
			_, err := optimizer.NewLARS(nil, optimizer.WithTrustCoefficient(float32(math.Inf(1))))
			return err
		}, []string{"trust coefficient is +Inf"}},
		{"option of another optimizer", func() error { _, err := optimizer.NewLARS(nil, optimizer.WithBetas(0.9, 0.999)); return err },
			[]string{"LARS: option WithBetas does not apply"}},
		{"AdamW has no layer adaptation", func() error {
			_, err := optimizer.NewAdamW(nil, optimizer.ExcludeFromLayerAdaptation("bias"))
			return err
		},
			[]string{"option ExcludeFromLayerAdaptation does not apply"}},
		{"bad pattern", func() error { _, err := optimizer.NewLAMB(nil, optimizer.ExcludeFromWeightDecay("(bias")); return err },
			[]string{"LAMB: ExcludeFromWeightDecay pattern \"(bias\""}},
		{"negative warmup", func() error {
			_, err := optimizer.NewAdamW(optimizer.Warmup{Steps: -5, Then: optimizer.Constant(0.1)})
			return err
		}, []string{"Warmup.Steps is -5, want >= 0"}},
		{"bad schedule under a warmup", func() error {
			_, err := optimizer.NewLAMB(optimizer.Warmup{Steps: 5, Then: optimizer.PolynomialDecay{Initial: nan, DecaySteps: 0}})
			return err
		}, []string{"Warmup.Then", "PolynomialDecay.Initial is NaN", "PolynomialDecay.DecaySteps is 0, want >= 1"}},
		{"negative rate", func() error { _, err := optimizer.NewLARS(optimizer.Constant(-0.1)); return err },
			[]string{"Constant learning rate is -0.1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.build()
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// The optimizers whose constructors return no error refuse bad input
// when the step is built.
func TestBuildRefusesBadInput(t *testing.T) {
	cases := []struct {
		name string
		opt  strategy.Optimizer
		want string
	}{
		{"NaN momentum", optimizer.NewMomentum(nil, nan, false), "Momentum: momentum is NaN, want a value in [0, 1]"},
		{"Adam beta above 1", optimizer.NewAdam(nil).WithBetas(0.9, 1.5), "Adam: beta2 is 1.5, want a value in [0, 1)"},
		{"negative rate", optimizer.NewSGD(optimizer.Constant(-1)), "SGD: Constant learning rate is -1"},
		{"piecewise lengths", optimizer.NewSGD(optimizer.PiecewiseConstant{Boundaries: []int64{10, 20}, Values: []float32{1, 2}}),
			"PiecewiseConstant: 2 values for 2 boundaries, want 3"},
		{"decreasing boundaries", optimizer.NewSGD(optimizer.PiecewiseConstant{Boundaries: []int64{20, 10}, Values: []float32{1, 2, 3}}),
			"PiecewiseConstant.Boundaries[1] is 10 after 20"},
		{"cosine decay steps", optimizer.NewKerasMomentum(optimizer.CosineDecay{Initial: 0.1}, 0.9, false), "CosineDecay.DecaySteps is 0, want >= 1"},
		{"exponential decay rate", optimizer.NewAdam(optimizer.ExponentialDecay{Initial: 0.1, DecaySteps: 10, Rate: -0.5}), "ExponentialDecay.Rate is -0.5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := onedevice.New()
			require.NoError(t, err)
			defer s.Close()
			var w strategy.Variable
			require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
				w, err = sc.Variable("w", tf.Float, []int64{2}, strategy.Zeros())
				return err
			}))
			_, err = s.Build(strategy.InputSpec{"g0": {DType: tf.Float, Shape: []int64{2}}}, linearLoss(c.opt, []strategy.Variable{w}))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
