// Package role holds the one rule by which tfdist decides which task of a
// job writes what only one task may write — a checkpoint directory
// (package checkpoint), a SavedModel (package savedmodel) — so that every
// writer, and distribute.IsChief, agree on it.
package role

// IsChief reports whether the task that runs src is its job's chief: the
// one task that writes shared files. A source with an IsChief() bool
// method — multiworker.Strategy, whose cluster names the chief (tf.distribute's
// multi_worker_util.is_chief) — is the chief only when that method says
// so. Any other source is the chief: a strategy of one process (default,
// mirrored) is its own job, and a parameter-server strategy exists only on
// the cluster's chief, its coordinator (its ps and worker tasks serve and
// never get one).
func IsChief(src any) bool {
	if c, ok := src.(interface{ IsChief() bool }); ok {
		return c.IsChief()
	}
	return true
}

// Writes reports whether the task that runs src writes the shared files:
// *override when it is set (an explicit WithChief option), IsChief(src)
// otherwise.
func Writes(src any, override *bool) bool {
	if override != nil {
		return *override
	}
	return IsChief(src)
}
