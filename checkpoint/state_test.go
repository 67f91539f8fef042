package checkpoint

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// A state file as Python's tf.train.CheckpointManager writes it.
const pythonState = `model_checkpoint_path: "ckpt-3"
all_model_checkpoint_paths: "ckpt-2"
all_model_checkpoint_paths: "ckpt-3"
all_model_checkpoint_timestamps: 1712345679.5
all_model_checkpoint_timestamps: 1712345680.25
last_preserved_timestamp: 1712345670.0
`

// The state file reader understands what TensorFlow writes, and what the
// writer writes reads back unchanged, whatever the paths contain.
func TestStateFileFormat(t *testing.T) {
	st, err := parseState([]byte(pythonState))
	require.NoError(t, err)
	assert.Equal(t, &checkpointState{latest: "ckpt-3", all: []string{"ckpt-2", "ckpt-3"},
		times: []float64{1712345679.5, 1712345680.25}, lastPreserved: 1712345670}, st)

	odd := &checkpointState{latest: `dir "x"/ckpt-1`, all: []string{"a\\b", "tab\there", "new\nline", "caf\xc3\xa9", "bell\a"},
		times: []float64{1, 2.5, 3, 4, 5}, lastPreserved: 1}
	back, err := parseState(odd.marshal())
	require.NoError(t, err)
	assert.Equal(t, odd, back)

	// Python escapes non-ASCII bytes as octal, quotes with ' sometimes, and
	// may add comments or fields this version does not know.
	st, err = parseState([]byte("# comment\nmodel_checkpoint_path: 'caf\\303\\251'\nfuture_field: 7\nall_model_checkpoint_paths: \"a\\'b\\x41\"\n"))
	require.NoError(t, err)
	assert.Equal(t, "caf\xc3\xa9", st.latest)
	assert.Equal(t, []string{"a'bA"}, st.all)

	for _, bad := range []string{"model_checkpoint_path \"x\"", "model_checkpoint_path: \"x", "model_checkpoint_path: 3", "all_model_checkpoint_timestamps: \"x\"", ":"} {
		_, err := parseState([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// A manager takes over a directory whose state file Python wrote.
func TestManagerReadsPythonStateFile(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	e := newEngine(t, 0)
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("v", tf.Float, nil, strategy.Zeros())
		return err
	}))
	s, err := NewSaver(e)
	require.NoError(t, err)
	for _, name := range []string{"ckpt-2", "ckpt-3"} {
		require.NoError(t, s.Save(ctx, filepath.Join(dir, name), nil))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, StateFile), []byte(pythonState), 0o644))

	m, err := NewManager(e, dir, WithMaxToKeep(2))
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "ckpt-2"), filepath.Join(dir, "ckpt-3")}, m.Checkpoints())
	step, _, err := m.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), step, "no global_step metadata: the step comes from the name")
	_, err = m.Save(ctx, 4, nil)
	require.NoError(t, err)
	assert.NoFileExists(t, IndexFile(filepath.Join(dir, "ckpt-2")))
}
