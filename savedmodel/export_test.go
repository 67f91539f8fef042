package savedmodel_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// inGraph is what the tests need of an in-graph strategy.
type inGraph interface {
	strategy.ValueReader
	Scope(func(strategy.Scope) error) error
	Build(strategy.InputSpec, strategy.ReplicaFn) (strategy.Step, error)
	RunReplicas(context.Context, strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
	NumLocalReplicas() int
}

func loadDigits(t *testing.T) digits.Data {
	d, err := digits.Load()
	require.NoError(t, err)
	return d
}

// trainMLP creates the digits MLP in s and trains it for steps batches of
// 32 examples, split evenly among s's replicas.
func trainMLP(t *testing.T, s inGraph, d digits.Data, steps int) *nn.Sequential {
	var m *nn.Sequential
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = models.New(sc, "mlp", 32, 7)
		return err
	}))
	step, err := s.Build(models.Spec, models.TrainStep(m, optimizer.NewSGD(optimizer.Constant(0.2))))
	require.NoError(t, err)
	const batch = 32
	for i := range steps {
		lo := i * batch % (d.Len() - batch)
		_, err := s.RunReplicas(testContext(t), step, feeds(t, s.NumLocalReplicas(), d.X[lo:lo+batch], d.Y[lo:lo+batch]), batch)
		require.NoError(t, err)
	}
	return m
}

// feeds splits x (and y, when not nil) evenly among n replicas.
func feeds(t *testing.T, n int, x [][]float32, y []int32) []map[string]*tf.Tensor {
	per := len(x) / n
	out := make([]map[string]*tf.Tensor, n)
	for r := range out {
		xt, err := tf.NewTensor(x[r*per : (r+1)*per])
		require.NoError(t, err)
		out[r] = map[string]*tf.Tensor{"x": xt}
		if y != nil {
			yt, err := tf.NewTensor(y[r*per : (r+1)*per])
			require.NoError(t, err)
			out[r]["y"] = yt
		}
	}
	return out
}

// predict returns m's logits on x as s computes them.
func predict(t *testing.T, s inGraph, m *nn.Sequential, x [][]float32) [][]float32 {
	sig := models.ServingSignature(m)
	step, err := s.Build(sig.Inputs, sig.Fn)
	require.NoError(t, err)
	res, err := s.RunReplicas(testContext(t), step, feeds(t, s.NumLocalReplicas(), x, nil), len(x))
	require.NoError(t, err)
	var out [][]float32
	for _, part := range res["logits"] {
		out = append(out, part.Value().([][]float32)...)
	}
	return out
}

// loadInGo returns the logits that graft's LoadSavedModel computes with
// the serving_default signature of the SavedModel in dir.
func loadInGo(t *testing.T, dir string, x [][]float32) [][]float32 {
	sm, err := tf.LoadSavedModel(dir, []string{savedmodel.ServeTag}, nil)
	require.NoError(t, err)
	defer sm.Session.Close()
	sig, ok := sm.Signatures[savedmodel.DefaultSignature]
	require.True(t, ok, "signatures: %v", sm.Signatures)
	in, out := sig.Inputs["x"], sig.Outputs["logits"]
	require.Equal(t, []int64{-1, 64}, mustSlice(t, in.Shape))
	require.Equal(t, []int64{-1, 10}, mustSlice(t, out.Shape))
	xt, err := tf.NewTensor(x)
	require.NoError(t, err)
	res, err := sm.Session.Run(map[tf.Output]*tf.Tensor{output(t, sm.Graph, in.Name): xt},
		[]tf.Output{output(t, sm.Graph, out.Name)}, nil)
	require.NoError(t, err)
	return res[0].Value().([][]float32)
}

func mustSlice(t *testing.T, s tf.Shape) []int64 {
	out, err := s.ToSlice()
	require.NoError(t, err)
	return out
}

// output returns the tensor "op:index" of g.
func output(t *testing.T, g *tf.Graph, name string) tf.Output {
	var opName string
	var idx int
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == ':' {
			opName = name[:i]
			for _, c := range name[i+1:] {
				idx = idx*10 + int(c-'0')
			}
			break
		}
	}
	o := g.Operation(opName)
	require.NotNil(t, o, "no op %q", opName)
	return o.Output(idx)
}

func requireClose(t *testing.T, want, got [][]float32, tol float64) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.InDeltaSlice(t, want[i], got[i], tol, "example %d", i)
	}
}

// TestExportLoadsBackInGo trains the MLP on two mirrored replicas, exports
// it, and checks that graft's LoadSavedModel computes the strategy's
// predictions, that the files are TensorFlow's layout, and that the
// trained values (not the initial ones) were exported.
func TestExportLoadsBackInGo(t *testing.T) {
	d := loadDigits(t)
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer s.Close()
	m := trainMLP(t, s, d, 30)
	x := d.X[:100]
	want := predict(t, s, m, x)

	dir := filepath.Join(t.TempDir(), "digits")
	got, err := savedmodel.Export(testContext(t), s, dir, []savedmodel.Signature{models.ServingSignature(m)})
	require.NoError(t, err)
	require.Equal(t, dir, got)
	for _, f := range []string{"saved_model.pb", "variables/variables.index", "variables/variables.data-00000-of-00001"} {
		require.FileExists(t, filepath.Join(dir, f))
	}
	requireClose(t, want, loadInGo(t, dir, x), 1e-6)
}
