// Package launch runs one program as every task of a local TensorFlow
// cluster on 127.0.0.1: the engine of "tfdist launch".
//
// A Launcher picks a free loopback port per task, gives each process the
// TF_CONFIG that names its task (and TFDIST_TASK_TYPE, TFDIST_TASK_INDEX and
// TFDIST_RESTART), prefixes every line the process writes with its task
// ("[worker:1] "), and waits:
//
//   - in a cluster without parameter servers, for every task; the first task
//     that fails stops the others (SIGTERM, then SIGKILL after a grace period)
//     and fails the run;
//   - in a parameter-server cluster (WithPS), for the chief: the ps and
//     worker tasks serve forever, so they are stopped when the chief exits,
//     and the chief's status is the run's.
//
// In a parameter-server cluster a worker that exits while the chief runs is
// restarted on its own, at the same address, so that the chief's coordinator
// takes it back (and reruns the step it was running): up to WithTaskRestarts
// times per worker (default 3), after a delay that starts at one second and
// doubles up to 30 (WithRestartBackoff). Its TFDIST_RESTART counts its
// restarts. A worker that exits once more fails the run with a *TaskError
// that names it, its status and its last lines of output. A ps task that
// exits fails the run at once: it held its share of the variables in memory
// only, so a restarted one would hold none, and the coordinator cannot go on
// without them. An evaluator that exits is left alone.
//
// Every task gets the whole cluster, the evaluator included, as TensorFlow
// expects; cluster.ClusterSpec.SplitEvaluator gives each side its part.
//
// WithTimeline gives each task a file of its own to write its step
// timeline to (timeline.Env) and, when Run ends, merges the traces the
// tasks wrote into one Chrome trace, a track per task. WithMetrics gives
// each task a loopback address of its own to serve its Prometheus metrics
// on (monitoring.Env).
//
// After a failure, WithMaxRestarts restarts the whole cluster, on new ports,
// as torchrun does; the program then resumes from its last checkpoint. Every
// task runs in its own process group, so that signals and the final sweep
// reach everything a task starts (the program "go run" builds, a shell's
// children): the group of a worker that exited is killed before its restart,
// and no process outlives Run.
package launch
