package checkpoint

import (
	"context"
	"fmt"
)

// BackupAndRestore is fault tolerance for a training loop, as Keras'
// BackupAndRestore callback: it checkpoints every N steps through a Manager
// (atomically, so a crash mid-write never costs the last good checkpoint) and,
// when the job starts again, restores the latest checkpoint so the loop
// resumes from its step. The step is also the input position: a loop whose
// input is deterministic skips that many batches and the resumed run equals
// an uninterrupted one.
//
// Every worker of a multi-worker job calls it in the same places, with the
// same directory and options: all restore from the chief's directory, all
// take part in each save, and only the chief's save is kept — the chief as
// NewManager finds it from the strategy (WithChief overrides); the other
// workers never write the directory.
type BackupAndRestore struct {
	m     *Manager
	every int64
}

// NewBackupAndRestore checkpoints src's variables into dir every `every` steps.
// It takes the Manager's options (WithMaxToKeep, WithChief, …) and writes
// dir only on the chief, as NewManager does.
func NewBackupAndRestore(src Source, dir string, every int64, opts ...Option) (*BackupAndRestore, error) {
	if every < 1 {
		return nil, fmt.Errorf("checkpoint: BackupAndRestore: every %d steps, expected at least 1", every)
	}
	m, err := NewManager(src, dir, opts...)
	if err != nil {
		return nil, err
	}
	return &BackupAndRestore{m: m, every: every}, nil
}

// Manager returns the underlying Manager.
func (b *BackupAndRestore) Manager() *Manager { return b.m }

// Restore restores the latest checkpoint, if any, and returns the number of
// steps it had completed (0 when there is none). Call it after the training
// step is built, so that optimizer slots exist.
func (b *BackupAndRestore) Restore(ctx context.Context) (int64, error) {
	step, _, err := b.m.RestoreLatest(ctx)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: BackupAndRestore: %w", err)
	}
	return step, nil
}

// AfterStep saves a checkpoint when step (the number of completed steps) is
// a multiple of the interval.
func (b *BackupAndRestore) AfterStep(ctx context.Context, step int64) error {
	if step <= 0 || step%b.every != 0 {
		return nil
	}
	if _, err := b.m.Save(ctx, step, nil); err != nil {
		return fmt.Errorf("checkpoint: BackupAndRestore: step %d: %w", step, err)
	}
	return nil
}
