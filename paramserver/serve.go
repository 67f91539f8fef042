package paramserver

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/mtls"
)

// checkCluster reports a cluster that parameter-server training cannot use.
func checkCluster(spec cluster.ClusterSpec) error {
	if spec.IsEmpty() {
		return fmt.Errorf("%w: no cluster (TF_CONFIG is unset or names none); expected a chief, "+
			"one or more workers and one or more ps tasks, e.g. under tfdist launch --chief --workers 2 --ps 2", ErrBadCluster)
	}
	var missing []string
	for _, job := range []cluster.TaskType{cluster.Chief, cluster.Worker, cluster.PS} {
		if !spec.HasJob(job) {
			missing = append(missing, fmt.Sprintf("no %s job", job))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: cluster %s: %s; expected a chief (the coordinator), one or more workers and one or more ps tasks",
			ErrBadCluster, spec, strings.Join(missing, ", "))
	}
	return nil
}

// startServer starts the TensorFlow server of task.
func startServer(spec cluster.ClusterSpec, task cluster.Task, c config) (*tfrt.Server, error) {
	var opts []tfrt.ConfigOption
	if c.intra > 0 || c.inter > 0 {
		opts = append(opts, tfrt.WithThreads(c.intra, c.inter))
	}
	def, err := spec.SplitEvaluator(task.Type).ServerDef(task.Type, task.Index, tfrt.NewConfig(opts...))
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	srv, err := tfrt.NewServer(def)
	if err != nil {
		return nil, fmt.Errorf("paramserver: server of task %s: %w", task, err)
	}
	if err := srv.Start(); err != nil {
		srv.Close()
		return nil, fmt.Errorf("paramserver: start the server of task %s: %w", task, err)
	}
	return srv, nil
}

// Serve runs a ps or worker task of a parameter-server cluster: it starts
// the task's TensorFlow server, from r's cluster (TF_CONFIG when r is nil),
// and serves until ctx is done, which ends the job for this task (tfdist
// launch sends SIGTERM to the ps and worker tasks when the chief exits; make
// ctx end on it with signal.NotifyContext). It then returns nil. The chief
// and the other tasks place variables and run steps on the server through
// their sessions; the task runs no code of its own.
//
// TensorFlow cannot stop a started server inside a process: the server keeps
// its port until the process exits, so a task exits after Serve returns.
func Serve(ctx context.Context, r cluster.Resolver, opts ...Option) error {
	c := newConfig(opts)
	if r == nil {
		var err error
		if r, err = cluster.FromEnv(); err != nil {
			return fmt.Errorf("paramserver: %w", err)
		}
	}
	spec := r.ClusterSpec()
	if err := checkCluster(spec); err != nil {
		return err
	}
	if err := refuseUnencrypted(); err != nil {
		return err
	}
	task := cluster.TaskOf(r)
	if task.Type != cluster.PS && task.Type != cluster.Worker {
		return fmt.Errorf("%w: task %s: Serve runs ps and worker tasks; the chief calls New and coordinates", ErrBadCluster, task)
	}
	log := logging.ForTask(c.log, string(task.Type), task.Index)
	srv, err := startServer(spec, task, c)
	if err != nil {
		return err
	}
	log.Info("serving", zap.String("target", srv.Target()), zap.Stringer("cluster_fingerprint", spec.Fingerprint()))
	<-ctx.Done()
	log.Info("stopping", zap.NamedError("reason", context.Cause(ctx)))
	return srv.Stop()
}

// InProcessCluster is a parameter-server cluster whose ps and worker tasks
// all serve inside this process, on free loopback ports: a way to try the
// strategy, and to test programs, without starting processes. Its chief is
// this process too: pass Resolver to New.
//
// The servers keep their ports until the process exits (TensorFlow cannot
// stop them), so one cluster serves one Strategy (New starts the chief's
// server on the cluster's chief port); and a task of the cluster cannot fail
// on its own: use real processes (tfdist launch) to see workers come and go.
type InProcessCluster struct {
	spec cluster.ClusterSpec
	r    *cluster.SimpleResolver
}

// StartInProcessCluster starts the servers of workers worker tasks and ps ps
// tasks in this process. Options: WithThreads.
func StartInProcessCluster(workers, ps int, opts ...Option) (*InProcessCluster, error) {
	if workers < 1 || ps < 1 {
		return nil, fmt.Errorf("%w: StartInProcessCluster(workers %d, ps %d): expected at least one of each", ErrBadCluster, workers, ps)
	}
	c := newConfig(opts)
	ports, err := freeport.Loopback(1 + workers + ps)
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	jobs := map[cluster.TaskType][]string{cluster.Chief: {addr(0)}}
	for i := range workers {
		jobs[cluster.Worker] = append(jobs[cluster.Worker], addr(1+i))
	}
	for i := range ps {
		jobs[cluster.PS] = append(jobs[cluster.PS], addr(1+workers+i))
	}
	spec, err := cluster.NewClusterSpec(jobs)
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	for _, t := range spec.Tasks() {
		if t.Type == cluster.Chief {
			continue
		}
		if _, err := startServer(spec, t, c); err != nil {
			return nil, err
		}
	}
	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Chief})
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	return &InProcessCluster{spec: spec, r: r}, nil
}

// Spec returns the cluster.
func (c *InProcessCluster) Spec() cluster.ClusterSpec { return c.spec }

// Resolver returns the chief's resolver, for New.
func (c *InProcessCluster) Resolver() cluster.Resolver { return c.r }

// refuseUnencrypted fails when the environment requires TLS
// (TFDIST_REQUIRE_TLS): the strategy runs over TensorFlow's gRPC server.
func refuseUnencrypted() error {
	if err := mtls.RefuseUnencryptedFromEnv(os.LookupEnv, "the parameter-server strategy"); err != nil {
		return fmt.Errorf("paramserver: %w", err)
	}
	return nil
}
