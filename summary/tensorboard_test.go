package summary_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/summary"
)

// TensorBoard itself reads the files we write: its event-file loader (which
// verifies both checksums of every record) finds the file version, and the
// accumulator behind its scalars plugin serves exactly the scalars we
// logged, at their steps and wall times, in both scalar forms, and the
// graphs plugin the graph we wrote.
//
// TensorBoard is installed with pip from the pinned
// testdata/tensorboard-requirements.txt into a virtual environment under the
// tfdist cache, once. The test is skipped only when pip cannot reach the
// package index (or there is no python3 to run pip).
func TestTensorBoardReadsEventFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the test that installs TensorBoard")
	}
	python := pyenv.Python(t, "tensorboard", filepath.Join("testdata", "tensorboard-requirements.txt"))
	for _, form := range []struct {
		name string
		opts []summary.Option
	}{{"simple_value", nil}, {"tensor", []summary.Option{summary.WithTensorScalars()}}} {
		t.Run(form.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := summary.NewWriter(dir, form.opts...)
			require.NoError(t, err)
			logRun(t, w, 30)
			require.NoError(t, w.Graph(smallGraph(t)))
			require.NoError(t, w.Close())
			want, err := summary.ReadScalars(w.Path())
			require.NoError(t, err)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := python(ctx, filepath.Join("testdata", "tensorboard_read.py"), dir)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "TensorBoard's reader failed:\n%s", stderr.String())
			var tb struct {
				FileVersions []string                `json:"file_versions"`
				Scalars      map[string][][3]float64 `json:"scalars"`
				GraphNodes   []string                `json:"graph_nodes"`
			}
			require.NoError(t, json.Unmarshal(out, &tb), "output: %s", out)

			assert.Equal(t, []string{"brain.Event:2"}, tb.FileVersions)
			assert.ElementsMatch(t, []string{"x", "y"}, tb.GraphNodes)
			byTag := map[string][]summary.Scalar{}
			for _, s := range want {
				byTag[s.Tag] = append(byTag[s.Tag], s)
			}
			require.Len(t, tb.Scalars, len(byTag), "tags: %v", tb.Scalars)
			for tag, series := range byTag {
				got := tb.Scalars[tag]
				require.Len(t, got, len(series), tag)
				for i, s := range series {
					assert.Equal(t, float64(s.Step), got[i][0], "%s[%d] step", tag, i)
					assert.Equal(t, s.Value, got[i][1], "%s[%d] value", tag, i)
					wall := float64(s.WallTime.UnixNano()) / 1e9
					assert.InDelta(t, wall, got[i][2], 1e-5, "%s[%d] wall time", tag, i)
				}
			}
		})
	}
}
