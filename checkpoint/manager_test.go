package checkpoint

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
)

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func withHook(h func(stage string) error) Option { return func(c *config) { c.hook = h } }

// failAt makes Manager.Save fail right after stage, as if the process died
// there.
func failAt(stage string) Option {
	return withHook(func(s string) error {
		if s == stage {
			return errors.New("simulated crash")
		}
		return nil
	})
}

func sameValues(t *testing.T, want, got map[string]*tf.Tensor) {
	t.Helper()
	require.Equal(t, len(want), len(got))
	for name, w := range want {
		assert.Equal(t, w.Value(), got[name].Value(), name)
	}
}

// The manager keeps the newest max_to_keep checkpoints, deletes older ones,
// records them in a state file TensorFlow reads, and takes them over when a
// new manager opens the directory.
func TestManagerKeepsMaxToKeep(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	tr := newTrainer(t, newEngine(t, 0), sgd())
	m, err := NewManager(tr.e, dir, WithMaxToKeep(2))
	require.NoError(t, err)
	latest, err := m.Latest()
	require.NoError(t, err)
	assert.Empty(t, latest)

	for _, step := range []int64{10, 20, 30} {
		p, err := m.Save(ctx, step, nil)
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(dir, "ckpt-"+itoa(step)), p)
	}
	assert.Equal(t, []string{filepath.Join(dir, "ckpt-20"), filepath.Join(dir, "ckpt-30")}, m.Checkpoints())
	assert.Equal(t, []string{"checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
		"ckpt-30.data-00000-of-00001", "ckpt-30.index"}, dirNames(t, dir))
	latest, err = m.Latest()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "ckpt-30"), latest)

	state, err := os.ReadFile(filepath.Join(dir, StateFile))
	require.NoError(t, err)
	lines := strings.Split(string(state), "\n")
	assert.Equal(t, []string{`model_checkpoint_path: "ckpt-30"`, `all_model_checkpoint_paths: "ckpt-20"`,
		`all_model_checkpoint_paths: "ckpt-30"`}, lines[:3])
	assert.Contains(t, string(state), "all_model_checkpoint_timestamps: ")

	again, err := NewManager(tr.e, dir, WithMaxToKeep(2))
	require.NoError(t, err)
	assert.Equal(t, m.Checkpoints(), again.Checkpoints())
	_, err = again.Save(ctx, 40, nil)
	require.NoError(t, err)
	assert.NoFileExists(t, IndexFile(filepath.Join(dir, "ckpt-20")))
	assert.Equal(t, []string{filepath.Join(dir, "ckpt-30"), filepath.Join(dir, "ckpt-40")}, again.Checkpoints())
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// RestoreLatest returns step 0 when there is nothing to restore, and
// otherwise the saved step and metadata, with the variables restored.
func TestRestoreLatestResumesFromItsStep(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()

	fresh := newTrainer(t, newEngine(t, 2), adam())
	m, err := NewManager(fresh.e, dir)
	require.NoError(t, err)
	step, md, err := m.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Zero(t, step)
	assert.Nil(t, md)

	fresh.run(t, 0, 5)
	_, err = m.Save(ctx, 5, Metadata{"input_position": int64(5 * globalBatch)})
	require.NoError(t, err)
	want := values(t, fresh.e)

	next := newTrainer(t, newEngine(t, 4), adam())
	m2, err := NewManager(next.e, dir)
	require.NoError(t, err)
	step, md, err = m2.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(5), step)
	pos, ok := md.Int64("input_position")
	assert.True(t, ok)
	assert.Equal(t, int64(5*globalBatch), pos)
	sameValues(t, want, values(t, next.e))
}

// A save interrupted at any point leaves the previous checkpoint as Latest,
// complete and restorable; the next manager cleans up, and saving again
// works.
func TestInterruptedSaveKeepsLastGoodCheckpoint(t *testing.T) {
	for _, stage := range []string{"written", "data-renamed", "renamed"} {
		t.Run(stage, func(t *testing.T) {
			ctx := testContext(t)
			dir := t.TempDir()
			tr := newTrainer(t, newEngine(t, 0), sgd())
			tr.run(t, 0, 1)
			m, err := NewManager(tr.e, dir, WithMaxToKeep(1))
			require.NoError(t, err)
			_, err = m.Save(ctx, 1, nil)
			require.NoError(t, err)
			good := values(t, tr.e)

			tr.run(t, 1, 2)
			crashing, err := NewManager(tr.e, dir, WithMaxToKeep(1), failAt(stage))
			require.NoError(t, err)
			_, err = crashing.Save(ctx, 2, nil)
			require.ErrorContains(t, err, "simulated crash")

			check := newTrainer(t, newEngine(t, 0), sgd())
			m2, err := NewManager(check.e, dir, WithMaxToKeep(1))
			require.NoError(t, err)
			latest, err := m2.Latest()
			require.NoError(t, err)
			assert.Equal(t, filepath.Join(dir, "ckpt-1"), latest)
			step, _, err := m2.RestoreLatest(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(1), step)
			sameValues(t, good, values(t, check.e))

			_, err = m2.Save(ctx, 2, nil)
			require.NoError(t, err)
			assert.Equal(t, []string{"checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"}, dirNames(t, dir))
		})
	}
}

// What a crashed save leaves — a half-written temporary directory, a stray
// index — is never taken for a checkpoint, and the next manager removes the
// temporary directory.
func TestHalfWrittenFilesAreIgnored(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	tr := newTrainer(t, newEngine(t, 0), sgd())
	m, err := NewManager(tr.e, dir)
	require.NoError(t, err)
	_, err = m.Save(ctx, 1, nil)
	require.NoError(t, err)

	tmp := filepath.Join(dir, ".ckpt-2.tmp-123")
	require.NoError(t, os.MkdirAll(tmp, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "ckpt-2.index"), []byte("half an ind"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ckpt-2.data-00000-of-00001"), []byte("partial"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".checkpoint.tmp-9"), []byte("model_checkpoint_path: \"ckpt-2\""), 0o644))

	m2, err := NewManager(tr.e, dir)
	require.NoError(t, err)
	latest, err := m2.Latest()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "ckpt-1"), latest)
	assert.NoDirExists(t, tmp)
	assert.NoFileExists(t, filepath.Join(dir, ".checkpoint.tmp-9"))
	_, err = m2.Save(ctx, 2, nil)
	require.NoError(t, err)
	_, err = m2.Saver().Restore(ctx, filepath.Join(dir, "ckpt-2"))
	require.NoError(t, err)
}

// Saving a step that is already kept replaces it atomically: interrupted
// midway, Latest is still a complete checkpoint of that step.
func TestReplacingAKeptCheckpointIsAtomic(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	tr := newTrainer(t, newEngine(t, 0), sgd())
	m, err := NewManager(tr.e, dir, WithMaxToKeep(1))
	require.NoError(t, err)
	_, err = m.Save(ctx, 5, nil)
	require.NoError(t, err)

	tr.run(t, 0, 1)
	newer := values(t, tr.e)
	crashing, err := NewManager(tr.e, dir, WithMaxToKeep(1), failAt("data-renamed"))
	require.NoError(t, err)
	_, err = crashing.Save(ctx, 5, nil)
	require.ErrorContains(t, err, "simulated crash")

	check := newTrainer(t, newEngine(t, 0), sgd())
	m2, err := NewManager(check.e, dir, WithMaxToKeep(1))
	require.NoError(t, err)
	step, _, err := m2.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(5), step)
	sameValues(t, newer, values(t, check.e))

	// Without a crash, the replacement lands under its own name.
	_, err = m2.Save(ctx, 5, nil)
	require.NoError(t, err)
	latest, err := m2.Latest()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "ckpt-5"), latest)
	assert.Equal(t, []string{"checkpoint", "ckpt-5.data-00000-of-00001", "ckpt-5.index"}, dirNames(t, dir))
}

// A non-chief worker runs the save into a temporary directory that is
// removed, writes nothing to the shared directory, and reads the chief's
// checkpoints from it.
func TestNonChiefWritesNothingToTheSharedDirectory(t *testing.T) {
	ctx := testContext(t)
	shared := filepath.Join(t.TempDir(), "shared")
	scratch := t.TempDir()
	tr := newTrainer(t, newEngine(t, 0), sgd())

	worker, err := NewManager(tr.e, shared, WithChief(false), WithWorkerTempDir(scratch))
	require.NoError(t, err)
	p, err := worker.Save(ctx, 1, nil)
	require.NoError(t, err)
	assert.Empty(t, p)
	assert.NoDirExists(t, shared)
	assert.Empty(t, dirNames(t, scratch))

	chief, err := NewManager(tr.e, shared)
	require.NoError(t, err)
	_, err = chief.Save(ctx, 1, nil)
	require.NoError(t, err)
	latest, err := worker.Latest()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(shared, "ckpt-1"), latest)
	step, _, err := worker.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), step)
}

// A non-chief's temporary directory may not be the shared directory or
// lie in it, where its saves would write the shared directory.
func TestNonChiefRefusesATempDirInTheSharedDirectory(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared")
	e := newEngine(t, 0)
	for _, tmp := range []string{shared, filepath.Join(shared, "tmp")} {
		_, err := NewManager(e, shared, WithChief(false), WithWorkerTempDir(tmp))
		require.Error(t, err, tmp)
		assert.Contains(t, err.Error(), "WithWorkerTempDir")
	}
	assert.NoDirExists(t, shared)
	_, err := NewManager(e, shared, WithChief(false), WithWorkerTempDir(filepath.Dir(shared)))
	require.NoError(t, err, "a parent of the shared directory is outside it")
}

const crashEnv = "TFDIST_CHECKPOINT_CRASH_DIR"

// A process killed (SIGKILL) between renaming a checkpoint's data file and
// its index leaves the previous checkpoint as Latest and restorable.
func TestKilledMidSaveKeepsLastGoodCheckpoint(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashingChild(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx := testContext(t)
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKilledMidSaveKeepsLastGoodCheckpoint$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child should have been killed; output:\n%s", out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child: %v\n%s", err, out)
	assert.FileExists(t, DataFile(filepath.Join(dir, "ckpt-2"), 0, 1), "the child died with ckpt-2's data file in place")
	assert.NoFileExists(t, IndexFile(filepath.Join(dir, "ckpt-2")))

	// The child trained one step and saved it as ckpt-1: the same step here.
	ref := newTrainer(t, newEngine(t, 0), sgd())
	ref.run(t, 0, 1)
	want := values(t, ref.e)

	check := newTrainer(t, newEngine(t, 0), sgd())
	m, err := NewManager(check.e, dir)
	require.NoError(t, err)
	step, _, err := m.RestoreLatest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), step)
	sameValues(t, want, values(t, check.e))
	for _, n := range dirNames(t, dir) {
		assert.False(t, strings.Contains(n, ".tmp-"), "stale temporary %s survived NewManager", n)
	}
}

func crashingChild(t *testing.T, dir string) {
	ctx := testContext(t)
	tr := newTrainer(t, newEngine(t, 0), sgd())
	tr.run(t, 0, 1)
	m, err := NewManager(tr.e, dir, withHook(func(stage string) error {
		if stage == "data-renamed" && fileExists(DataFile(filepath.Join(dir, "ckpt-2"), 0, 1)) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return nil
	}))
	require.NoError(t, err)
	_, err = m.Save(ctx, 1, nil)
	require.NoError(t, err)
	tr.run(t, 1, 2)
	_, err = m.Save(ctx, 2, nil)
	require.NoError(t, err)
	t.Fatal("not killed")
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}
