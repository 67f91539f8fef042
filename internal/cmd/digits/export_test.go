package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/classifier"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

// exportAccuracy loads the SavedModel in dir with graft's LoadSavedModel
// and returns the share of the held-out digits (test-size held-out
// examples, split with seed, as the classifier splits them) whose logits
// from serving_default name the right class.
func exportAccuracy(t *testing.T, dir string, testSize int, seed uint64) float64 {
	t.Helper()
	data, err := digits.Load()
	require.NoError(t, err)
	_, test := data.Split(testSize, seed)
	sm, err := tf.LoadSavedModel(dir, []string{savedmodel.ServeTag}, nil)
	require.NoError(t, err)
	defer sm.Session.Close()
	sig := sm.Signatures[savedmodel.DefaultSignature]
	x, err := tf.NewTensor(test.X)
	require.NoError(t, err)
	out, err := sm.Session.Run(map[tf.Output]*tf.Tensor{tensorOf(t, sm.Graph, sig.Inputs["x"].Name): x},
		[]tf.Output{tensorOf(t, sm.Graph, sig.Outputs["logits"].Name)}, nil)
	require.NoError(t, err)
	logits := strategy.TensorValue(out[0]).([][]float32)
	require.Len(t, logits, test.Len())
	right := 0
	for i, row := range logits {
		best := 0
		for c := range row {
			if row[c] > row[best] {
				best = c
			}
		}
		if int32(best) == test.Y[i] {
			right++
		}
	}
	return float64(right) / float64(test.Len())
}

// tensorOf returns the tensor a signature names ("op:0").
func tensorOf(t *testing.T, g *tf.Graph, name string) tf.Output {
	require.Regexp(t, `:0$`, name)
	o := g.Operation(name[:len(name)-2])
	require.NotNil(t, o, name)
	return o.Output(0)
}

// -export-dir writes a SavedModel of the trained model, LeNet included,
// whose held-out accuracy (computed by the loaded SavedModel) is the one
// the run reports; -export-version -1 adds a version each run.
func TestExportDirServesTheTrainedModel(t *testing.T) {
	base := t.TempDir()
	for i, model := range []string{"mlp", "lenet"} {
		res, err := classifier.Run(context.Background(), options(t, "-strategy", "mirrored", "-devices", "2", "-model", model, "-steps", "60", "-log-every", "0",
			"-export-dir", base, "-export-version", "-1"), io.Discard)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(base, []string{"1", "2"}[i]), res.ExportDir)
		require.Equal(t, res.Accuracy, exportAccuracy(t, res.ExportDir, 297, 1), model)
	}
}

// exportedVariables reads every variable of the SavedModel in dir from
// its variables checkpoint, with TensorFlow's RestoreV2, sorted by name.
func exportedVariables(t *testing.T, dir string) []strategy.VariableValue {
	t.Helper()
	prefix := filepath.Join(dir, "variables", "variables")
	entries, err := checkpoint.List(prefix)
	require.NoError(t, err)
	var names, slices []string
	var dtypes []tf.DataType
	for _, e := range entries {
		if strings.HasPrefix(e.Name, checkpoint.MetadataPrefix) {
			continue
		}
		names, slices, dtypes = append(names, e.Name), append(slices, ""), append(dtypes, e.DType)
	}
	require.NotEmpty(t, names, "variables in %s", prefix)
	s := op.NewScope()
	outs := op.RestoreV2(s, op.Const(s.SubScope("prefix"), prefix), op.Const(s.SubScope("names"), names),
		op.Const(s.SubScope("slices"), slices), dtypes)
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	vals, err := sess.Run(nil, outs, nil)
	require.NoError(t, err)
	out := make([]strategy.VariableValue, len(vals))
	for i, v := range vals {
		out[i] = strategy.VariableValue{Name: names[i], Shape: v.Shape()}
		out[i].Float32 = tensorutil.Float32s(v)
		require.NotNil(t, out[i].Float32, "variable %s: type %v, expected float32", names[i], v.DataType())
	}
	return out
}

// assertSameExport asserts that the SavedModels in dirs want and got hold
// the same variables, element by element within tol of each variable's
// largest magnitude.
func assertSameExport(t *testing.T, want, got string, tol float64) {
	t.Helper()
	assertSameVariables(t, exportedVariables(t, want), exportedVariables(t, got), tol, "export "+got)
}
