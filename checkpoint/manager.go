package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/fsutil"
	"github.com/tfdist/tfdist/internal/role"
)

// Manager keeps the checkpoints of a training run in one directory, as
// tf.train.CheckpointManager: Save writes ckpt-<step> and records it in the
// directory's "checkpoint" state file; Latest and RestoreLatest find the
// newest; only the newest WithMaxToKeep checkpoints are kept.
//
// Save is atomic. The checkpoint is written into a temporary directory
// beside the final one, synced, and renamed into place (data files first,
// the index last); only then is the state file replaced — itself written to
// a temporary file, synced and renamed — and only after that are the
// checkpoints beyond max_to_keep deleted. A crash at any point leaves the
// previous checkpoint as Latest, complete and readable; a half-written
// temporary directory is ignored and removed by the next NewManager.
//
// Only the chief writes the directory (see WithChief for how a Manager
// knows it is the chief): every worker of a multi-worker job can make a
// Manager of the same directory and call Save, and the other workers' saves
// go to temporary directories elsewhere.
//
// A Manager is safe for concurrent use; saves are serialised. One Manager
// (one chief) writes a directory at a time.
type Manager struct {
	saver *Saver
	dir   string
	cfg   config
	chief bool // writes dir

	mu   sync.Mutex
	kept []keptCheckpoint // oldest first
}

type keptCheckpoint struct {
	path string  // as recorded in the state file: relative to dir, or absolute
	time float64 // seconds since the epoch
}

// NewManager returns a Manager of src's variables writing to dir.
//
// Whether this task writes dir follows src's role unless WithChief says
// otherwise: a source with an IsChief() bool method (multiworker.Strategy)
// writes only when it reports true, the parameter-server strategy (which
// exists only on the chief) and every single-process strategy write. So
// every worker of a multi-worker job can call NewManager with the same
// directory and the same options.
//
// On the chief it creates dir if need be, takes over the checkpoints its
// state file lists and removes temporary files an interrupted save left
// behind. On any other task it creates, writes and removes nothing in dir,
// now or later: its saves go to a temporary directory outside dir
// (WithWorkerTempDir, which must not lie inside dir) that is removed right
// after, and it only reads dir, in Latest and RestoreLatest.
//
// Options: WithMaxToKeep, WithChief, WithCheckpointName, WithWorkerTempDir,
// WithLogger and the Saver's options.
func NewManager(src Source, dir string, opts ...Option) (*Manager, error) {
	if dir == "" {
		return nil, errors.New("checkpoint: NewManager: empty directory")
	}
	saver, err := NewSaver(src, opts...)
	if err != nil {
		return nil, err
	}
	m := &Manager{saver: saver, dir: filepath.Clean(dir), cfg: newConfig(opts)}
	m.chief = role.Writes(src, m.cfg.chief)
	if m.cfg.name == "" || strings.ContainsAny(m.cfg.name, `/\`) {
		return nil, fmt.Errorf("checkpoint: WithCheckpointName(%q): expected a file name", m.cfg.name)
	}
	if !m.chief {
		if err := m.checkWorkerTemp(); err != nil {
			return nil, err
		}
		m.cfg.log.Debug("not the chief: saves go to a temporary directory", zap.String("dir", m.dir))
		return m, nil
	}
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: NewManager: %w", err)
	}
	st, err := m.readState()
	if err != nil {
		return nil, err
	}
	if st != nil {
		for i, p := range st.all {
			k := keptCheckpoint{path: p}
			if i < len(st.times) {
				k.time = st.times[i]
			}
			m.kept = append(m.kept, k)
		}
	}
	m.removeStale(st)
	return m, nil
}

// checkWorkerTemp refuses a non-chief's temporary directory that is dir or
// lies inside it, where the worker's save would write into the shared
// directory.
func (m *Manager) checkWorkerTemp() error {
	tmp := m.cfg.workerTmp
	if tmp == "" {
		tmp = os.TempDir()
	}
	absTmp, err1 := filepath.Abs(tmp)
	absDir, err2 := filepath.Abs(m.dir)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("checkpoint: NewManager: %w", err)
	}
	if rel, err := filepath.Rel(absDir, absTmp); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("checkpoint: NewManager on a non-chief task: its temporary directory %s lies in the shared directory %s; "+
			"set WithWorkerTempDir to a directory outside it", tmp, m.dir)
	}
	return nil
}

// IsChief reports whether this Manager writes its directory (see
// NewManager and WithChief).
func (m *Manager) IsChief() bool { return m.chief }

// Directory returns the directory of the checkpoints.
func (m *Manager) Directory() string { return m.dir }

// Saver returns the Manager's Saver, to save or restore other prefixes
// with the same ops.
func (m *Manager) Saver() *Saver { return m.saver }

// Checkpoints returns the prefixes of the checkpoints this Manager keeps,
// oldest first: none on a task that is not the chief.
func (m *Manager) Checkpoints() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.kept))
	for i, k := range m.kept {
		out[i] = m.resolve(k.path)
	}
	return out
}

// Latest returns the prefix of the newest complete checkpoint the state
// file records ("" when there is none). It reads the directory afresh, so a
// non-chief worker sees what the chief wrote.
func (m *Manager) Latest() (string, error) {
	st, err := m.readState()
	if err != nil || st == nil {
		return "", err
	}
	cands := append([]string{st.latest}, reverse(st.all)...)
	for _, p := range cands {
		if p == "" {
			continue
		}
		prefix := m.resolve(p)
		if err := complete(prefix); err != nil {
			m.cfg.log.Warn("checkpoint in the state file is not usable", zap.String("prefix", prefix), zap.Error(err))
			continue
		}
		return prefix, nil
	}
	return "", nil
}

// Save writes the variables and md as checkpoint <name>-<step> (ckpt-200),
// with step recorded as metadata under GlobalStepKey, and returns its
// prefix. On a task that is not the chief it writes into a temporary
// directory outside the Manager's, removes it, and returns "". Saving a
// step that is already kept replaces that checkpoint, still atomically.
func (m *Manager) Save(ctx context.Context, step int64, md Metadata) (string, error) {
	if step < 0 {
		return "", fmt.Errorf("checkpoint: Save: step %d, expected a non-negative step", step)
	}
	all := make(Metadata, len(md)+1)
	for k, v := range md {
		all[k] = v
	}
	all[GlobalStepKey] = step
	base := fmt.Sprintf("%s-%d", m.cfg.name, step)
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	if !m.chief {
		return "", m.saveAsWorker(ctx, base, all)
	}

	tmpDir, err := os.MkdirTemp(m.dir, "."+base+".tmp-")
	if err != nil {
		return "", fmt.Errorf("checkpoint: save %s: %w", base, err)
	}
	committedTmp := false
	defer func() {
		if !committedTmp {
			os.RemoveAll(tmpDir)
		}
	}()
	tmp := filepath.Join(tmpDir, base)
	if err := m.saver.Save(ctx, tmp, all); err != nil {
		return "", err
	}
	if err := m.stage("written"); err != nil {
		return "", err
	}
	files, err := checkpointFiles(tmp)
	if err != nil {
		return "", fmt.Errorf("checkpoint: save %s: the written checkpoint: %w", base, err)
	}
	for _, f := range files {
		if err := fsutil.SyncFile(f); err != nil {
			return "", fmt.Errorf("checkpoint: save %s: %w", base, err)
		}
	}
	if err := fsutil.SyncDir(tmpDir); err != nil {
		return "", fmt.Errorf("checkpoint: save %s: %w", base, err)
	}

	final := filepath.Join(m.dir, base)
	prev := m.without(base)
	replacing := len(prev) < len(m.kept)
	if replacing {
		// The state file names this prefix: point it at the complete
		// temporary copy while the files are replaced.
		rel, _ := filepath.Rel(m.dir, tmp)
		temp := append(append([]keptCheckpoint(nil), prev...), keptCheckpoint{path: rel, time: now()})
		if err := m.writeState(temp); err != nil {
			return "", err
		}
		m.kept = temp
		committedTmp = true // the state names it: removed only once it no longer does
		if err := m.stage("temporary-committed"); err != nil {
			return "", err
		}
	} else if err := removeCheckpointFiles(final); err != nil { // an uncommitted leftover
		return "", fmt.Errorf("checkpoint: save %s: remove leftover files: %w", base, err)
	}
	for i, f := range files {
		dst := final + strings.TrimPrefix(f, tmp)
		if replacing {
			err = replaceKeeping(f, dst)
		} else {
			err = os.Rename(f, dst)
		}
		if err != nil {
			return "", fmt.Errorf("checkpoint: save %s: %w", base, err)
		}
		if i == len(files)-2 { // every data file is in place, the index is not
			if err := m.stage("data-renamed"); err != nil {
				return "", err
			}
		}
	}
	if err := fsutil.SyncDir(m.dir); err != nil {
		return "", fmt.Errorf("checkpoint: save %s: %w", base, err)
	}
	if err := m.stage("renamed"); err != nil {
		return "", err
	}

	kept := append(prev, keptCheckpoint{path: base, time: now()})
	var dropped []keptCheckpoint
	if n := m.cfg.maxToKeep; n > 0 && len(kept) > n {
		dropped, kept = kept[:len(kept)-n], kept[len(kept)-n:]
	}
	if err := m.writeState(kept); err != nil {
		return "", err
	}
	m.kept = kept
	committedTmp = false
	if err := m.stage("committed"); err != nil {
		return "", err
	}
	for _, d := range dropped {
		m.remove(d.path)
	}
	m.cfg.log.Info("checkpoint saved", zap.String("prefix", final), zap.Int64("step", step),
		zap.Int("kept", len(kept)), zap.Duration("took", time.Since(start)))
	return final, nil
}

// saveAsWorker runs a non-chief worker's save into a temporary directory
// outside the shared one (checkWorkerTemp) and removes it.
func (m *Manager) saveAsWorker(ctx context.Context, base string, md Metadata) error {
	dir, err := os.MkdirTemp(m.cfg.workerTmp, "tfdist-worker-ckpt-")
	if err != nil {
		return fmt.Errorf("checkpoint: save %s on a non-chief worker: %w", base, err)
	}
	defer os.RemoveAll(dir)
	return m.saver.Save(ctx, filepath.Join(dir, base), md)
}

// RestoreLatest restores the newest checkpoint and returns its step and
// metadata; with no checkpoint it returns step 0, no metadata and no error,
// so a program can call it unconditionally on start and resume from the
// returned step.
func (m *Manager) RestoreLatest(ctx context.Context) (int64, Metadata, error) {
	latest, err := m.Latest()
	if err != nil || latest == "" {
		return 0, nil, err
	}
	md, err := m.saver.Restore(ctx, latest)
	if err != nil {
		return 0, nil, err
	}
	step, ok := md.Int64(GlobalStepKey)
	if !ok {
		_, num, _ := strings.Cut(filepath.Base(latest), m.cfg.name+"-")
		step, _ = strconv.ParseInt(num, 10, 64)
	}
	m.cfg.log.Info("checkpoint restored", zap.String("prefix", latest), zap.Int64("step", step))
	return step, md, nil
}

func (m *Manager) stage(name string) error {
	if m.cfg.hook == nil {
		return nil
	}
	if err := m.cfg.hook(name); err != nil {
		return fmt.Errorf("checkpoint: save interrupted after stage %q: %w", name, err)
	}
	return nil
}

func (m *Manager) resolve(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(m.dir, p)
}

// remove deletes a checkpoint that is no longer kept, and the temporary
// directory it lies in if a replacing save left it there.
func (m *Manager) remove(path string) {
	prefix := m.resolve(path)
	if err := removeCheckpointFiles(prefix); err != nil {
		m.cfg.log.Warn("cannot delete an old checkpoint", zap.String("prefix", prefix), zap.Error(err))
		return
	}
	if first, _, ok := strings.Cut(filepath.ToSlash(path), "/"); ok && !filepath.IsAbs(path) &&
		strings.HasPrefix(first, "."+m.cfg.name+"-") && strings.Contains(first, ".tmp-") {
		os.RemoveAll(filepath.Join(m.dir, first))
	}
}

// Clear deletes the Manager's checkpoints and its state file, and then
// the directory if nothing else is left in it: what a backup that training
// no longer needs leaves behind. Files the Manager did not write stay. On
// a worker that is not the chief it does nothing.
func (m *Manager) Clear() error {
	if !m.chief {
		return nil
	}
	for _, k := range m.kept {
		m.remove(k.path)
	}
	m.kept = nil
	if err := os.Remove(filepath.Join(m.dir, StateFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: clear %s: %w", m.dir, err)
	}
	if entries, err := os.ReadDir(m.dir); err == nil && len(entries) == 0 {
		os.Remove(m.dir)
	}
	return nil
}

// without returns a copy of the kept list without base.
func (m *Manager) without(base string) []keptCheckpoint {
	out := make([]keptCheckpoint, 0, len(m.kept)+1)
	for _, k := range m.kept {
		if filepath.Clean(k.path) != base {
			out = append(out, k)
		}
	}
	return out
}

func (m *Manager) readState() (*checkpointState, error) {
	b, err := os.ReadFile(filepath.Join(m.dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read state: %w", err)
	}
	st, err := parseState(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", filepath.Join(m.dir, StateFile), err)
	}
	return st, nil
}

// writeState atomically records kept (the newest last) in the state file.
func (m *Manager) writeState(kept []keptCheckpoint) error {
	st := &checkpointState{}
	for _, k := range kept {
		st.all = append(st.all, k.path)
		st.times = append(st.times, k.time)
	}
	if len(kept) > 0 {
		st.latest = kept[len(kept)-1].path
		st.lastPreserved = kept[0].time
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(m.dir, StateFile), st.marshal()); err != nil {
		return fmt.Errorf("checkpoint: write state: %w", err)
	}
	return nil
}

// removeStale deletes what interrupted saves left: temporary checkpoint
// directories the state file does not name, and temporary state files.
func (m *Manager) removeStale(st *checkpointState) {
	named := map[string]bool{}
	if st != nil {
		for _, p := range append([]string{st.latest}, st.all...) {
			if first, _, ok := strings.Cut(filepath.ToSlash(p), "/"); ok && !filepath.IsAbs(p) {
				named[first] = true
			}
		}
	}
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		stale := e.IsDir() && strings.HasPrefix(n, "."+m.cfg.name+"-") && strings.Contains(n, ".tmp-") && !named[n] ||
			!e.IsDir() && strings.HasPrefix(n, "."+StateFile+".tmp-")
		if !stale {
			continue
		}
		if err := os.RemoveAll(filepath.Join(m.dir, n)); err != nil {
			m.cfg.log.Warn("cannot remove a stale temporary file", zap.String("path", n), zap.Error(err))
			continue
		}
		m.cfg.log.Info("removed what an interrupted save left", zap.String("path", n))
	}
}

// checkpointFiles returns the files of the checkpoint at prefix: its data
// files, then its index.
func checkpointFiles(prefix string) ([]string, error) {
	ix, err := readIndex(prefix)
	if err != nil {
		return nil, err
	}
	var files []string
	for i := range ix.numShards {
		files = append(files, DataFile(prefix, i, ix.numShards))
	}
	return append(files, IndexFile(prefix)), nil
}

// complete checks that the checkpoint at prefix has a readable index and
// every data file it names.
func complete(prefix string) error {
	files, err := checkpointFiles(prefix)
	if err != nil {
		return err
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return err
		}
	}
	return nil
}

// removeCheckpointFiles deletes a checkpoint: its index first, so that it
// stops being a checkpoint, then its data files.
func removeCheckpointFiles(prefix string) error {
	if err := fsutil.RemoveIfExists(IndexFile(prefix)); err != nil {
		return err
	}
	dir, base := filepath.Split(prefix)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), base+".data-") {
			if err := fsutil.RemoveIfExists(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// replaceKeeping puts a copy of src at dst, replacing dst atomically, and
// leaves src in place.
func replaceKeeping(src, dst string) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".link-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := fsutil.LinkOrCopy(src, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func reverse(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }
