package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/timeline"
)

// BackupAndRestore is Keras's BackupAndRestore callback: it backs up every
// variable of the strategy (the model's, the optimizer's slots and step
// count) with where training is — the epoch, the step in it and the
// epoch's running logs — and when a job that failed runs Fit again with
// the same Dir, it restores the backup and resumes at that step: a
// synchronous strategy skips the batches the epoch had trained on
// (the data must be deterministic: a seeded shuffle is), so the resumed
// job ends with the model, and the logs, of a job never interrupted.
// Under PerReplicaBatch it skips the epoch's examples, and rescales the
// learning rate, when the job resumes on another number of replicas.
// Under parameter servers the workers' inputs start afresh, as steps run
// asynchronously have no global order to resume in.
//
// Every worker of a synchronous job uses the same Dir: each takes part in
// every save, and only the chief writes Dir (see checkpoint.NewManager);
// all restore from it. When training ends without an error the backup is
// deleted, as Keras deletes it, unless KeepBackup.
type BackupAndRestore struct {
	BaseCallback
	// Dir is the backup's directory.
	Dir string
	// SaveFreq backs up every SaveFreq steps and at the end of every
	// epoch; 0 backs up at the end of every epoch only.
	SaveFreq int
	// KeepBackup keeps the backup once training has ended.
	KeepBackup bool

	mgr  *checkpoint.Manager
	base int64 // the steps done before this Fit, restored
}

// Name implements the name callbacks are known by in errors.
func (b *BackupAndRestore) Name() string { return "BackupAndRestore" }

// metadata keys of a backup.
const (
	backupEpoch  = "train/epoch"
	backupStep   = "train/step_in_epoch"
	backupTotals = "train/epoch_totals"
	// backupReplicas is the replicas the rate is scaled for, under
	// PerReplicaBatch.
	backupReplicas = "train/replicas"
)

// OnTrainBegin restores the backup, if there is one, and has Fit resume
// where it was taken.
func (b *BackupAndRestore) OnTrainBegin(ctx context.Context, r *Run) error {
	if b.Dir == "" {
		return errors.New("an empty Dir, expected the backup's directory")
	}
	if b.SaveFreq < 0 {
		return fmt.Errorf("SaveFreq %d, expected 0 (every epoch) or more", b.SaveFreq)
	}
	src, ok := r.Trainer().Strategy().(checkpoint.Source)
	if !ok {
		return fmt.Errorf("strategy of type %T cannot be checkpointed", r.Trainer().Strategy())
	}
	var err error
	if b.mgr, err = checkpoint.NewManager(src, b.Dir, checkpoint.WithMaxToKeep(2), checkpoint.WithCheckpointName("backup")); err != nil {
		return err
	}
	start := time.Now()
	step, md, err := b.mgr.RestoreLatest(ctx)
	if err != nil || md == nil {
		return err
	}
	r.t.timeline().Add(timeline.Span{Phase: timeline.Restart, Name: "resume from backup", Start: start, End: time.Now()})
	epoch, ok1 := md.Int64(backupEpoch)
	inEpoch, ok2 := md.Int64(backupStep)
	text, ok3 := md.Text(backupTotals)
	var totals []float64
	if !ok1 || !ok2 || !ok3 || json.Unmarshal([]byte(text), &totals) != nil {
		return fmt.Errorf("the backup in %s has no training position (is it a backup of another program?)", b.Dir)
	}
	b.base = step
	replicas, _ := md.Int64(backupReplicas)
	r.resumeAt(int(epoch), int(inEpoch), totals, int(replicas))
	return nil
}

// OnBatchEnd backs up every SaveFreq steps.
func (b *BackupAndRestore) OnBatchEnd(ctx context.Context, r *Run, batch int, _ Logs) error {
	if b.SaveFreq == 0 || (b.base+r.Steps())%int64(b.SaveFreq) != 0 {
		return nil
	}
	return b.save(ctx, r, r.Epoch(), batch+1, r.acc.values())
}

// OnEpochEnd backs up the start of the next epoch.
func (b *BackupAndRestore) OnEpochEnd(ctx context.Context, r *Run, epoch int, _ Logs) error {
	return b.save(ctx, r, epoch+1, 0, nil)
}

// OnTrainEnd deletes the backup unless KeepBackup.
func (b *BackupAndRestore) OnTrainEnd(context.Context, *Run, Logs) error {
	if b.KeepBackup {
		return nil
	}
	return b.mgr.Clear()
}

func (b *BackupAndRestore) save(ctx context.Context, r *Run, epoch, step int, totals []float64) error {
	text, err := json.Marshal(totals)
	if err != nil {
		return err
	}
	md := checkpoint.Metadata{backupEpoch: int64(epoch), backupStep: int64(step), backupTotals: string(text)}
	if r.replicas > 0 {
		md[backupReplicas] = int64(r.replicas)
	}
	defer r.t.checkpointed("backup", time.Now())
	_, err = b.mgr.Save(ctx, b.base+r.Steps(), md)
	return err
}
