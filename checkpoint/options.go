package checkpoint

import (
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

// Option configures a Saver or a Manager. Options that concern only a
// Manager (WithMaxToKeep, WithChief, …) are ignored by NewSaver.
type Option func(*config)

type config struct {
	log          *zap.Logger
	shard        ShardFunc
	allowPartial bool
	maxToKeep    int
	chief        *bool // nil: the source's role decides (internal/role)
	name         string
	workerTmp    string
	hook         func(stage string) error // tests: called between the steps of Manager.Save
}

func newConfig(opts []Option) config {
	c := config{log: zap.NewNop(), maxToKeep: 5, name: "ckpt"}
	for _, o := range opts {
		o(&c)
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	return c
}

// WithLogger sets the logger (default zap.NewNop()).
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// WithAllowPartial lets Restore succeed when the checkpoint lacks some of the
// model's variables (they keep their current values) or holds tensors no
// variable takes (they are ignored), as TensorFlow's expect_partial. By
// default both are errors, as assert_consumed: a model restored without its
// optimizer slots would otherwise silently resume with zeroed moments. A
// dtype or shape mismatch is always an error.
func WithAllowPartial(allow bool) Option { return func(c *config) { c.allowPartial = allow } }

// WithSharding writes the checkpoint in shards: fn gives, for each
// variable, the CPU device whose SaveV2 writes it; one SaveV2 runs per
// distinct device, each into a temporary prefix, and MergeV2Checkpoints
// merges them into one index with one data file per shard, as TensorFlow's
// sharded saver does. Metadata goes to the shard of the host device. nil (the
// default) writes one shard from the host device. See ShardByTask.
func WithSharding(fn ShardFunc) Option { return func(c *config) { c.shard = fn } }

// WithMaxToKeep sets how many checkpoints a Manager keeps (default 5); older
// ones are deleted once a newer one is complete. n <= 0 keeps every
// checkpoint.
func WithMaxToKeep(n int) Option { return func(c *config) { c.maxToKeep = n } }

// WithChief says whether this task writes the Manager's directory,
// overriding the default, which follows the source's role: a strategy with
// an IsChief method (multiworker.Strategy) writes only on the task its
// cluster makes the chief; a parameter-server strategy, which exists only on
// the chief (its coordinator), writes; a strategy of one process (default,
// mirrored) writes. savedmodel.Export follows the same rule, so a
// multi-worker program needs no option for only the chief to write.
//
// As in TensorFlow's MultiWorkerMirroredStrategy every worker runs the save
// — its variables may take part in collective reductions — but a non-chief
// worker writes into a temporary directory outside the Manager's (see
// WithWorkerTempDir) and removes it right after; it never creates, writes or
// removes anything in the Manager's directory, not even the state file or
// what an interrupted save left there. Latest and RestoreLatest read the
// shared directory on every worker.
func WithChief(chief bool) Option { return func(c *config) { c.chief = &chief } }

// WithWorkerTempDir sets where a non-chief worker's temporary checkpoints
// are written (default os.TempDir()). It must not be the Manager's
// directory or lie inside it: NewManager refuses that on a non-chief.
func WithWorkerTempDir(dir string) Option { return func(c *config) { c.workerTmp = dir } }

// WithCheckpointName sets the base name of a Manager's checkpoints (default
// "ckpt", giving ckpt-<step>), as tf.train.CheckpointManager's
// checkpoint_name.
func WithCheckpointName(name string) Option { return func(c *config) { c.name = name } }

// ShardFunc returns the CPU device whose SaveV2 writes v in a sharded save
// ("" keeps the device of each of v's slices: the host for an in-graph
// strategy's variable, the ps task for a parameter-server strategy's).
// Tensors with the same device share a shard.
type ShardFunc func(v strategy.Saveable) string

// ShardByTask shards a checkpoint by task, as TensorFlow does: each tensor
// is written by the CPU:0 of the task that holds its first slice, so that
// under a parameter-server strategy each ps task writes its own variables.
// On one machine it gives one shard.
func ShardByTask(v strategy.Saveable) string {
	if len(v.Slices) == 0 {
		return ""
	}
	d, err := tfrt.ParseDevice(v.Slices[0].Device)
	if err != nil || d.Job == "" {
		return ""
	}
	d.Type, d.Index = "CPU", 0
	return d.String()
}
