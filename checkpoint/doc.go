// Package checkpoint saves and restores the variables of a tfdist strategy
// in TensorFlow's checkpoint V2 format, with TensorFlow's own kernels:
// SaveV2 writes <prefix>.index and <prefix>.data-00000-of-00001,
// RestoreV2 reads them, and MergeV2Checkpoints joins the shards of a
// sharded save. Python reads what it writes:
//
//	r = tf.train.load_checkpoint("/runs/a/ckpt-200")
//	r.get_tensor("mlp/dense_0/kernel")
//	tf.train.latest_checkpoint("/runs/a")   # "/runs/a/ckpt-200"
//
// # What a checkpoint holds
//
// One tensor per variable, named by the variable's name
// ("mlp/dense_0/kernel", "mlp/dense_0/kernel/Adam/m", "Adam/iterations"), so
// optimizer slots and step counts are saved with the weights. A mirrored
// variable has one copy per replica but one value in the checkpoint: an
// OnWrite variable is saved from its primary copy; an OnRead variable as the
// aggregate of its copies (their sum or mean, computed by TensorFlow on the
// host, or copy 0 for AggregationOnlyFirstReplica). Restore assigns the
// saved value to every copy on every replica's device (an OnRead SUM
// variable gets value/replicas in each copy, so it still sums to the saved
// value, as in TensorFlow). A checkpoint therefore does not depend on the
// number of replicas: one written by a 2-replica mirrored strategy restores
// into 4 replicas or into the default strategy.
//
// An OnRead variable summed or averaged over several replicas (a
// BatchNorm's moving statistics, which each replica moves with its own
// batches) is also saved copy by copy, one row per replica, under
// CopiesPrefix+name ("_tfdist/replicas/lenet/batch_norm_0/moving_mean").
// A restore into as many replicas gives each its own copy back, so that a
// resumed job continues from exactly the state it saved; a restore into
// another number takes the aggregate, and a model without such copies
// ignores them.
//
// Metadata — named int64, float64 or string scalars such as the global step
// and the input pipeline's position — are saved as scalar tensors named
// MetadataPrefix+key ("_tfdist/metadata/global_step") by the same SaveV2,
// so they are exactly as durable as the variables, and Restore returns them.
//
// # Saver
//
// A Saver builds its save and restore ops once over the strategy's graph —
// the prefix is fed through a placeholder — and rebuilds them when the
// strategy's variables change (optimizer slots appear when a training step
// is built). A save or restore is one Session.Run and never overlaps a
// step.
//
// Restore checks the checkpoint's index against the model before changing
// anything and reports every disagreement in a *MismatchError: variables the
// checkpoint lacks, checkpoint tensors no variable takes (typically
// optimizer slots of a step not built yet), dtype or shape mismatches with
// both shapes. WithAllowPartial tolerates the first two, as TensorFlow's
// expect_partial. A variable saved as slices that do not cover it (a lost
// shard) is an *IncompleteError naming what is missing. Restored variables
// are marked initialised, so pending initialisers do not overwrite them.
//
// WithSharding writes one shard per device a ShardFunc chooses (ShardByTask:
// per task, as TensorFlow shards a parameter-server model), each with its
// own SaveV2 into a temporary prefix, merged by MergeV2Checkpoints. The
// default is one shard written from the host device.
//
// # Warm start
//
// WarmStart restores a model's variables from a checkpoint another program
// wrote — Python's tf.train.Checkpoint (object-based keys) or TensorFlow
// 1's Saver (name-based) — through a NameMap from variable names to
// checkpoint keys, checked as Restore checks; CompareNames lists both
// sides and what the map leaves unmatched.
//
// # Manager
//
// A Manager keeps a run's checkpoints in one directory, as
// tf.train.CheckpointManager: Save(ctx, step, md) writes ckpt-<step> and
// records it in the directory's "checkpoint" file (TensorFlow's
// CheckpointState text proto); Latest and RestoreLatest find the newest;
// the newest WithMaxToKeep are kept. RestoreLatest returns step 0 and no
// error when there is nothing to restore, so a program calls it on start
// and resumes from the step it returns.
//
// Save is atomic: it writes into a temporary directory, syncs the files,
// renames them into place (the index last), then atomically replaces the
// state file, and only then deletes checkpoints beyond max_to_keep. A crash
// at any point — tested by killing the process between renames — leaves the
// previous checkpoint as Latest, complete and restorable. Nothing a
// completed Save wrote is lost by a later failure.
//
// # Which task writes
//
// Under a multi-worker strategy every worker runs Save (its OnRead
// variables may be aggregated by collectives), but only the chief writes the
// shared directory, as in TensorFlow's MultiWorkerMirroredStrategy. The
// chief follows the source's role, with no option: a strategy with an
// IsChief() bool method (multiworker.Strategy) is the chief only on the task
// its cluster makes the chief; the parameter-server strategy, which exists
// only on the cluster's chief (its coordinator), is the chief; a strategy of
// one process (default, mirrored) is its own chief. savedmodel.Export
// decides by the same rule. WithChief overrides it.
//
// A Manager (or BackupAndRestore) on any other task never creates, writes
// or removes anything in the shared directory — not the directory itself,
// not the state file, not what an interrupted save left behind: its saves
// go to a temporary directory outside it (WithWorkerTempDir, os.TempDir()
// by default), removed right after, and it only reads the shared directory
// to find and restore the chief's checkpoints. A Saver, WarmStart and
// CompareNames have no chief: a Saver writes the prefix it is given on every
// task that calls Save, and WarmStart and CompareNames only read.
//
// Logging goes through zap (WithLogger; none by default); the package never
// prints.
package checkpoint
