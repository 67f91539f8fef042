package savedmodel_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

// pythonLoad is what testdata/load.py returns.
type pythonLoad struct {
	Logits     [][]float32 `json:"logits"`
	CLI        string      `json:"cli"`
	Signatures []string    `json:"signatures"`
}

func loadInPython(t *testing.T, dir string, x [][]float32) pythonLoad {
	var out pythonLoad
	pyenv.TensorFlow(t).JSON(t, "testdata/load.py", map[string]any{"dir": dir, "x": x}, &out)
	return out
}

// requireDescribed checks what saved_model_cli show --all says of the
// digits signature.
func requireDescribed(t *testing.T, cli string) {
	t.Helper()
	for _, want := range []string{
		"MetaGraphDef with tag-set: 'serve'",
		"signature_def['serving_default']:",
		"inputs['x'] tensor_info:", "dtype: DT_FLOAT", "shape: (-1, 64)",
		"outputs['logits'] tensor_info:", "shape: (-1, 10)",
		"Method name is: tensorflow/serving/predict",
	} {
		require.Contains(t, cli, want)
	}
}

// TestPythonLoadsMirroredExport: a model trained on two mirrored replicas
// and exported in TensorFlow Serving's layout is loaded by Python's
// tf.saved_model.load, whose serving_default signature gives Go's
// predictions on 100 digits; saved_model_cli describes it.
func TestPythonLoadsMirroredExport(t *testing.T) {
	d := loadDigits(t)
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer s.Close()
	m := trainMLP(t, s, d, 30)
	x := d.X[100:200]
	want := predict(t, s, m, x)

	base := t.TempDir()
	dir, err := savedmodel.Export(testContext(t), s, base, []savedmodel.Signature{models.ServingSignature(m)}, savedmodel.WithNextVersion())
	require.NoError(t, err)
	require.Equal(t, filepath.Join(base, "1"), dir)
	py := loadInPython(t, dir, x)
	requireClose(t, want, py.Logits, 1e-5)
	require.Equal(t, []string{"serving_default"}, py.Signatures)
	requireDescribed(t, py.CLI)
}

// TestPythonLoadsParameterServerExport: the chief of a parameter-server
// cluster exports a model whose kernels are sharded over two ps tasks;
// Python's predictions from the SavedModel equal the workers'.
func TestPythonLoadsParameterServerExport(t *testing.T) {
	d := loadDigits(t)
	cl, err := paramserver.StartInProcessCluster(1, 2, paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	s, err := paramserver.New(testContext(t), cl.Resolver(), paramserver.WithThreads(1, 2),
		paramserver.WithStepTimeout(30*time.Second), paramserver.WithPartitioner(paramserver.FixedShards(2)))
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 32, 7)
		return err
	}))
	c, err := paramserver.NewCoordinator(s)
	require.NoError(t, err)
	defer c.Done(testContext(t))
	train, err := s.Build(models.Spec, models.TrainStep(m, optimizer.NewSGD(optimizer.Constant(0.2))))
	require.NoError(t, err)
	for i := range 30 {
		lo := i * 32
		_, err := c.Schedule(train, paramserver.Feed(element(t, d.X[lo:lo+32], d.Y[lo:lo+32])))
		require.NoError(t, err)
	}
	require.NoError(t, c.Join(testContext(t)))

	x := d.X[100:200]
	sig := models.ServingSignature(m)
	serve, err := s.Build(sig.Inputs, sig.Fn)
	require.NoError(t, err)
	rv, err := c.Schedule(serve, paramserver.Feed(element(t, x, nil)))
	require.NoError(t, err)
	out, err := rv.Get(testContext(t))
	require.NoError(t, err)
	want := out["logits"].Value().([][]float32)

	dir, err := savedmodel.Export(testContext(t), s, filepath.Join(t.TempDir(), "digits"), []savedmodel.Signature{sig})
	require.NoError(t, err)
	py := loadInPython(t, dir, x)
	requireClose(t, want, py.Logits, 1e-5)
	requireDescribed(t, py.CLI)
	requireClose(t, want, loadInGo(t, dir, x), 1e-6)
}

func element(t *testing.T, x [][]float32, y []int32) dataset.Element {
	xt, err := tf.NewTensor(x)
	require.NoError(t, err)
	e := dataset.Element{"x": xt}
	if y != nil {
		yt, err := tf.NewTensor(y)
		require.NoError(t, err)
		e["y"] = yt
	}
	return e
}
