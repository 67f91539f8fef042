package savedmodel_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

// newModel returns the default strategy with the digits MLP.
func newModel(t *testing.T) (*onedevice.Strategy, *nn.Sequential) {
	s, err := onedevice.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 8, 1)
		return err
	}))
	return s, m
}

func logitsOf(m *nn.Sequential) strategy.ReplicaFn {
	return models.ServingSignature(m).Fn
}

// TestExportRefusesBadSignatures: every malformed signature is an error
// naming the signature and what is wrong, and nothing is written.
func TestExportRefusesBadSignatures(t *testing.T) {
	s, m := newModel(t)
	x := strategy.InputSpec{"x": models.Spec["x"]}
	var aX tf.Output // signature a's input, which b uses
	cases := []struct {
		name string
		sigs []savedmodel.Signature
		want string
	}{
		{"none", nil, "no signatures"},
		{"bad name", []savedmodel.Signature{{Name: "serving default", Inputs: x, Fn: logitsOf(m)}}, `name "serving default"`},
		{"twice", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: logitsOf(m)}, {Name: "a", Inputs: x, Fn: logitsOf(m)}}, `signature "a": named twice`},
		{"nil fn", []savedmodel.Signature{{Name: "a", Inputs: x}}, `signature "a": nil Fn`},
		{"bad input name", []savedmodel.Signature{{Name: "a", Inputs: strategy.InputSpec{"x-1": models.Spec["x"]}, Fn: logitsOf(m)}}, `input name "x-1"`},
		{"bad shape", []savedmodel.Signature{{Name: "a", Inputs: strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-2, 64}}}, Fn: logitsOf(m)}},
			`input "x": shape [-2 64]: dimension 0 is -2`},
		{"placeholder not an input", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			other := op.Placeholder(r.Scope().SubScope("other"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, 64)))
			logits, err := m.Apply(r, other, false)
			return strategy.Outputs{"logits": logits}, err
		}}}, `signature "a": output "logits" depends on placeholder "a/other/Placeholder", which is not an input of the signature (its inputs: x)`},
		{"another signature's input", []savedmodel.Signature{
			{Name: "a", Inputs: x, Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				aX = in["x"]
				return logitsOf(m)(r, in)
			}},
			{Name: "b", Inputs: strategy.InputSpec{"z": models.Spec["x"]}, Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				return logitsOf(m)(r, strategy.Inputs{"x": aX})
			}}}, `signature "b": output "logits" depends on placeholder "a_x"`},
		{"trains", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"], false)
			if err != nil {
				return nil, err
			}
			return nil, r.Minimize(optimizer.NewSGD(nil), logits, m.Vars())
		}}}, `signature "a": Minimize: a signature computes outputs; it does not train`},
		{"writes", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return nil, r.Assign(m.Vars()[1], strategy.MustRead(r, m.Vars()[1]))
		}}}, `signature "a": Assign "mlp/dense_0/bias": a signature must not change the model`},
		{"no outputs", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: func(strategy.Replica, strategy.Inputs) (strategy.Outputs, error) { return nil, nil }}},
			`signature "a": its Fn returned no outputs`},
		{"not a tensor", []savedmodel.Signature{{Name: "a", Inputs: x, Fn: func(strategy.Replica, strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"logits": {}}, nil
		}}}, `signature "a": output "logits" is not a tensor`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "model")
			_, err := savedmodel.Export(testContext(t), s, dir, tc.sigs)
			require.ErrorContains(t, err, tc.want)
			require.NoDirExists(t, dir)
		})
	}
}

// TestExportInsideScopeFails: exporting from inside the strategy's Scope
// function, before its variables are initialised, fails at once saying
// so, rather than waiting for Scope to return.
func TestExportInsideScopeFails(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	err = s.Scope(func(sc strategy.Scope) error {
		m, err := models.New(sc, "mlp", 8, 1)
		require.NoError(t, err)
		_, err = savedmodel.Export(testContext(t), s, t.TempDir()+"/m", []savedmodel.Signature{models.ServingSignature(m)})
		return err
	})
	require.ErrorIs(t, err, strategy.ErrInScope)
	require.ErrorContains(t, err, `variable "mlp/dense_0/bias"`)
	require.ErrorContains(t, err, "exist only once it returns")
}

// TestExportRefusesAnotherStrategysVariables: a signature reading a
// variable the exporting strategy does not hold fails naming it.
func TestExportRefusesAnotherStrategysVariables(t *testing.T) {
	s, _ := newModel(t)
	_, other := newModel(t)
	_, err := savedmodel.Export(testContext(t), s, filepath.Join(t.TempDir(), "m"), []savedmodel.Signature{models.ServingSignature(other)})
	require.ErrorContains(t, err, `variable "mlp/dense_0/bias", read by signature "serving_default"`)
	require.ErrorContains(t, err, "not created in this strategy")
}

// TestExportVersions: the export writes TensorFlow Serving's layout when
// asked, never replaces an export, and leaves no temporary directory.
func TestExportVersions(t *testing.T) {
	s, m := newModel(t)
	sigs := []savedmodel.Signature{models.ServingSignature(m)}
	base := t.TempDir()
	ctx := testContext(t)

	dir, err := savedmodel.Export(ctx, s, base, sigs, savedmodel.WithVersion(3))
	require.NoError(t, err)
	require.Equal(t, filepath.Join(base, "3"), dir)
	dir, err = savedmodel.Export(ctx, s, base, sigs, savedmodel.WithNextVersion())
	require.NoError(t, err)
	require.Equal(t, filepath.Join(base, "4"), dir)
	latest, err := savedmodel.LatestVersion(base)
	require.NoError(t, err)
	require.Equal(t, int64(4), latest)

	before, err := os.ReadFile(filepath.Join(base, "3", "saved_model.pb"))
	require.NoError(t, err)
	_, err = savedmodel.Export(ctx, s, base, sigs, savedmodel.WithVersion(3))
	require.ErrorContains(t, err, "exists and is not empty")
	after, err := os.ReadFile(filepath.Join(base, "3", "saved_model.pb"))
	require.NoError(t, err)
	require.Equal(t, before, after)
	_, err = savedmodel.Export(ctx, s, base, sigs, savedmodel.WithVersion(-2))
	require.ErrorContains(t, err, "WithVersion(-2)")

	entries, err := os.ReadDir(base)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"3", "4"}, names)

	empty := filepath.Join(base, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	_, err = savedmodel.Export(ctx, s, empty, sigs)
	require.NoError(t, err, "an empty directory is a valid target")
	_, err = savedmodel.Export(ctx, s, empty, sigs, savedmodel.WithChief(false))
	require.NoError(t, err, "a task that does not write does not check the target")
}
