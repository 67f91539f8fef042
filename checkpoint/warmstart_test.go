package checkpoint_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// kerasCheckpoints has Python train a Keras MLP on the digits and write
// its weights as object-based and name-based checkpoints.
type kerasCheckpoints struct {
	ObjectPrefix string            `json:"object_prefix"`
	ObjectKeys   map[string]string `json:"object_keys"`
	Paths        []string          `json:"paths"`
	NamePrefix   string            `json:"name_prefix"`
	Logits       [][]float32       `json:"logits"`
}

// mlpWithLogits builds the same MLP in the default strategy and a step
// that outputs its logits.
func mlpWithLogits(t *testing.T) (*onedevice.Strategy, *nn.MLP, strategy.Step) {
	t.Helper()
	s, err := onedevice.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var m *nn.MLP
	require.NoError(t, s.Scope(func(sc strategy.Scope) error {
		m, err = nn.NewMLP(sc, "mlp", []int{digits.Features, 32, digits.Classes}, 7)
		return err
	}))
	step, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}}},
		func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"])
			return strategy.Outputs{"logits": logits}, err
		})
	require.NoError(t, err)
	return s, m, step
}

func logits(t *testing.T, s *onedevice.Strategy, step strategy.Step, x [][]float32) [][]float32 {
	t.Helper()
	xt, err := tf.NewTensor(x)
	require.NoError(t, err)
	res, err := s.RunReplicas(context.Background(), step, []map[string]*tf.Tensor{{"x": xt}}, len(x))
	require.NoError(t, err)
	return res["logits"][0].Value().([][]float32)
}

func assertClose(t *testing.T, want, got [][]float32, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		for j := range want[i] {
			assert.InDelta(t, want[i][j], got[i][j], tol, "%s: example %d, logit %d", what, i, j)
		}
	}
}

// A Keras model trained in Python and written by tf.train.Checkpoint
// (object-based keys), or by TensorFlow 1's Saver (name-based keys), warm
// starts the same model in tfdist through a name map: its predictions are
// Python's to 1e-5. CompareNames lists what a map leaves unmatched, and a
// map that names a missing variable or key, or the wrong shape, is an
// error naming the variable.
func TestWarmStartFromPythonCheckpoints(t *testing.T) {
	data, err := digits.Load()
	require.NoError(t, err)
	train, test := data.Split(100, 1)
	var ck kerasCheckpoints
	pyenv.TensorFlow(t).JSON(t, "testdata/keras_checkpoint.py", map[string]any{"dir": t.TempDir(),
		"train_x": train.X[:512], "train_y": train.Y[:512], "x": test.X[:20]}, &ck)
	require.Len(t, ck.Paths, 4)

	s, m, step := mlpWithLogits(t)
	vars := m.Vars()
	require.Len(t, vars, 4)
	before := logits(t, s, step, test.X[:20])

	report, err := checkpoint.CompareNames(s, ck.ObjectPrefix, nil)
	require.NoError(t, err)
	assert.Len(t, report.UnmatchedModel, 4)
	assert.Len(t, report.Model, 4)
	objectMap, nameMap := checkpoint.NameMap{}, checkpoint.NameMap{}
	for i, v := range vars {
		objectMap[v.Name()] = ck.ObjectKeys[ck.Paths[i]]
		nameMap[v.Name()] = []string{"w1", "b1", "w2", "b2"}[i]
	}
	report, err = checkpoint.CompareNames(s, ck.ObjectPrefix, objectMap)
	require.NoError(t, err)
	assert.Empty(t, report.UnmatchedModel, report.String())
	assert.Len(t, report.UnmatchedCheckpoint, len(report.Checkpoint)-4, report.String())

	require.NoError(t, checkpoint.WarmStart(context.Background(), s, ck.ObjectPrefix, objectMap))
	assertClose(t, ck.Logits, logits(t, s, step, test.X[:20]), 1e-5, "object-based")

	s2, _, step2 := mlpWithLogits(t)
	assertClose(t, before, logits(t, s2, step2, test.X[:20]), 0, "a fresh model")
	require.NoError(t, checkpoint.WarmStart(context.Background(), s2, ck.NamePrefix, nameMap))
	assertClose(t, ck.Logits, logits(t, s2, step2, test.X[:20]), 1e-5, "name-based")

	bad := checkpoint.NameMap{vars[0].Name(): "b1"}
	err = checkpoint.WarmStart(context.Background(), s2, ck.NamePrefix, bad)
	assert.ErrorContains(t, err, `variable "`+vars[0].Name()+`": the checkpoint has float32[32], the model has float32[64 32]`)
	err = checkpoint.WarmStart(context.Background(), s2, ck.NamePrefix, checkpoint.NameMap{vars[0].Name(): "w9"})
	assert.ErrorContains(t, err, `the checkpoint holds no tensor "w9" (for variable "`+vars[0].Name()+`")`)
	err = checkpoint.WarmStart(context.Background(), s2, ck.NamePrefix, checkpoint.NameMap{"mlp/nope": "w1"})
	assert.ErrorContains(t, err, `the name map names "mlp/nope", which the model does not have`)
}
