package train_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/summary"
	"github.com/tfdist/tfdist/train"
)

// eventFile returns the path of dir's one event file.
func eventFile(t *testing.T, dir string) string {
	t.Helper()
	files, err := summary.EventFiles(dir)
	require.NoError(t, err)
	require.Len(t, files, 1, dir)
	return files[0]
}

// graphDefs returns the GraphDefs of dir's one event file.
func graphDefs(t *testing.T, dir string) [][]byte {
	t.Helper()
	events, err := summary.ReadEvents(eventFile(t, dir))
	require.NoError(t, err)
	var defs [][]byte
	for _, e := range events {
		if def := e.GetGraphDef(); def != nil {
			defs = append(defs, def)
		}
	}
	return defs
}

// scalarsIn reads the one event file of dir, by tag and step.
func scalarsIn(t *testing.T, dir string) map[string]map[int64]float64 {
	t.Helper()
	scalars, err := summary.ReadScalars(eventFile(t, dir))
	require.NoError(t, err)
	out := map[string]map[int64]float64{}
	for _, s := range scalars {
		if out[s.Tag] == nil {
			out[s.Tag] = map[int64]float64{}
		}
		out[s.Tag][s.Step] = s.Value
	}
	return out
}

// eventValue is v as an event file holds it.
func eventValue(v float64) float64 { return float64(float32(v)) }

// TensorBoard writes Keras's layout: train/ holds "epoch_"+key of every
// training log at each epoch — the learning rate too when the logs carry
// it — and every UpdateFreq steps "batch_"+key of the batch logs, at the
// step count; validation/ holds each "val_" log as "epoch_"+key. Every
// value is History's (or the batch's logs).
func TestTensorBoardWritesKerasLayout(t *testing.T) {
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := compiled(t, s)
	ds, val := overfitting(t)
	logdir := t.TempDir()
	batches := map[int64]train.Logs{}
	record := &train.LambdaCallback{
		BatchEnd: func(_ context.Context, r *train.Run, _ int, logs train.Logs) error {
			batches[r.Steps()] = logs
			return nil
		},
		EpochEnd: func(_ context.Context, _ *train.Run, epoch int, logs train.Logs) error {
			logs["learning_rate"] = 0.05 / float64(epoch+1) // as a schedule's callback would
			return nil
		},
	}
	h, err := tr.Fit(ctx, ds, train.Epochs(2), train.ValidationData(val),
		train.WithCallbacks(record, train.NewTensorBoard(logdir, train.TensorBoardUpdateFreq(2))))
	require.NoError(t, err)

	got := scalarsIn(t, filepath.Join(logdir, "train"))
	want := map[string]map[int64]float64{}
	for _, k := range []string{"loss", "accuracy", "learning_rate"} {
		want["epoch_"+k] = map[int64]float64{0: eventValue(h.Values[k][0]), 1: eventValue(h.Values[k][1])}
	}
	for _, k := range []string{"loss", "accuracy"} {
		want["batch_"+k] = map[int64]float64{}
		for _, step := range []int64{2, 4, 6} {
			want["batch_"+k][step] = eventValue(batches[step][k])
		}
	}
	assert.Equal(t, want, got)

	got = scalarsIn(t, filepath.Join(logdir, "validation"))
	want = map[string]map[int64]float64{}
	for _, k := range []string{"loss", "accuracy"} {
		want["epoch_"+k] = map[int64]float64{0: eventValue(h.Values["val_"+k][0]), 1: eventValue(h.Values["val_"+k][1])}
	}
	assert.Equal(t, want, got)
	assertModelGraph(t, filepath.Join(logdir, "train"), tr.Model())
}

// assertModelGraph checks that dir's event file holds the inference graph
// of m as TensorBoard's Graphs tab reads it: a GraphDef TensorFlow
// imports, with a placeholder per input, of any batch size, and a
// variable per model variable.
func assertModelGraph(t *testing.T, dir string, m *nn.Model) {
	t.Helper()
	defs := graphDefs(t, dir)
	require.Len(t, defs, 1, "one graph")
	g := tf.NewGraph()
	require.NoError(t, g.Import(defs[0], ""))
	vars := map[string]bool{}
	var placeholders []string
	for _, o := range g.Operations() {
		switch o.Type() {
		case "Placeholder":
			placeholders = append(placeholders, o.Name())
			shape, err := o.Attr("shape")
			require.NoError(t, err)
			dims, err := shape.(tf.Shape).ToSlice()
			require.NoError(t, err)
			assert.Equal(t, append([]int64{-1}, m.Inputs()[0].Shape...), dims)
		case "VarHandleOp":
			name, err := o.Attr("shared_name")
			require.NoError(t, err)
			vars[name.(string)] = true
		}
	}
	assert.Equal(t, []string{"serving_default_" + m.Inputs()[0].Name}, placeholders)
	for _, v := range m.Variables() {
		assert.True(t, vars[v.Name()], "variable %s in %v", v.Name(), vars)
	}
}

// TensorBoardWriteGraph(false) writes no graph.
func TestTensorBoardWriteGraphFalse(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	ds, _ := overfitting(t)
	logdir := t.TempDir()
	_, err = compiled(t, s).Fit(context.Background(), ds, train.Epochs(1),
		train.WithCallbacks(train.NewTensorBoard(logdir, train.TensorBoardWriteGraph(false))))
	require.NoError(t, err)
	assert.Empty(t, graphDefs(t, filepath.Join(logdir, "train")))
	assert.NotEmpty(t, scalarsIn(t, filepath.Join(logdir, "train")))
}
