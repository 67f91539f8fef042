package paramserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/taskserver"
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

// taskName returns the name the graphs give task t's devices' task.
func taskName(t cluster.Task) string {
	return fmt.Sprintf("/job:%s/replica:0/task:%d", t.Type, t.Index)
}

// hostOptions returns the options of a task's local TensorFlow session.
func (c config) hostOptions() (*tf.SessionOptions, error) {
	var opts []tfrt.ConfigOption
	if c.intra > 0 || c.inter > 0 {
		opts = append(opts, tfrt.WithThreads(c.intra, c.inter))
	}
	so, err := tfrt.SessionOptions("", opts...)
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	return so, nil
}

// taskOptions returns the options of task servers and their clients in
// a job of cluster spec: its identity, its TLS, the logger.
func taskOptions(spec cluster.ClusterSpec, tlsCfg *tls.Config, log *zap.Logger) []taskserver.Option {
	return []taskserver.Option{taskserver.WithJob(spec.Fingerprint().String()), taskserver.WithTLS(tlsCfg), taskserver.WithLogger(log)}
}

// taskServer is a ps or worker task's server, serving a TensorFlow session
// of its own.
type taskServer struct {
	host   *partition.Host
	server *taskserver.Server
	done   chan error
}

// startTask starts the server of t on its port (on every interface, as a
// TensorFlow server listens).
func startTask(spec cluster.ClusterSpec, t cluster.Task, c config, tlsCfg *tls.Config, log *zap.Logger) (*taskServer, error) {
	addr, err := spec.TaskAddress(t.Type, t.Index)
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("paramserver: task %s: address %q: %w", t, addr, err)
	}
	so, err := c.hostOptions()
	if err != nil {
		return nil, err
	}
	var hopts []partition.HostOption
	if t.Type == cluster.Worker {
		hopts = append(hopts, partition.Interruptible()) // a worker's state lives on the ps tasks
	}
	host, err := partition.NewHost(so, hopts...)
	if err != nil {
		return nil, fmt.Errorf("paramserver: task %s: %w", t, err)
	}
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("paramserver: task %s: listen on port %s: %w", t, port, err)
	}
	ts := &taskServer{host: host, server: taskserver.NewServer(host, taskOptions(spec, tlsCfg, log)...), done: make(chan error, 1)}
	go func() { ts.done <- ts.server.Serve(ln) }()
	return ts, nil
}

// stop closes the server and the session: the task's variables are gone.
func (t *taskServer) stop() error {
	err := t.server.Close()
	<-t.done
	return errors.Join(err, t.host.Close())
}

// Serve runs a ps or worker task of a parameter-server cluster: it starts
// the task's server, from r's cluster (TF_CONFIG when r is nil), and serves
// until ctx is done, which ends the job for this task (tfdist launch sends
// SIGTERM to the ps and worker tasks when the chief exits; make ctx end on
// it with signal.NotifyContext). It then stops the server and returns nil.
// The chief and the workers import parts of their graphs into the task's
// TensorFlow session and run them through the server; the task runs no
// code of its own.
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
	t := cluster.TaskOf(r)
	if t.Type != cluster.PS && t.Type != cluster.Worker {
		return fmt.Errorf("%w: task %s: Serve runs ps and worker tasks; the chief calls New and coordinates", ErrBadCluster, t)
	}
	log := logging.ForTask(c.log, string(t.Type), t.Index)
	tlsCfg, err := c.security(log)
	if err != nil {
		return err
	}
	ts, err := startTask(spec, t, c, tlsCfg, log)
	if err != nil {
		return err
	}
	addr, _ := spec.TaskAddress(t.Type, t.Index)
	log.Info("serving", zap.String("address", addr), zap.Bool("tls", tlsCfg != nil),
		zap.Stringer("cluster_fingerprint", spec.Fingerprint()))
	<-ctx.Done()
	log.Info("stopping", zap.NamedError("reason", context.Cause(ctx)))
	return ts.stop()
}

// InProcessCluster is a parameter-server cluster whose ps and worker tasks
// all serve inside this process, on free loopback ports, each with a
// TensorFlow session of its own: a way to try the strategy, and to test
// programs, without starting processes. Its chief is this process too:
// pass Resolver to New. Close stops the tasks.
type InProcessCluster struct {
	spec  cluster.ClusterSpec
	r     *cluster.SimpleResolver
	tasks map[cluster.Task]*taskServer
}

// StartInProcessCluster starts the servers of workers worker tasks and ps ps
// tasks in this process. Options: WithThreads, WithTLS, WithLogger.
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
	tlsCfg, err := c.security(c.log)
	if err != nil {
		return nil, err
	}
	ic := &InProcessCluster{spec: spec, tasks: map[cluster.Task]*taskServer{}}
	for _, t := range spec.Tasks() {
		if t.Type == cluster.Chief {
			continue
		}
		ts, err := startTask(spec, t, c, tlsCfg, logging.ForTask(c.log, string(t.Type), t.Index))
		if err != nil {
			ic.Close()
			return nil, err
		}
		ic.tasks[t] = ts
	}
	if ic.r, err = cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Chief}); err != nil {
		ic.Close()
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	return ic, nil
}

// Spec returns the cluster.
func (c *InProcessCluster) Spec() cluster.ClusterSpec { return c.spec }

// Resolver returns the chief's resolver, for New.
func (c *InProcessCluster) Resolver() cluster.Resolver { return c.r }

// Close stops every task of the cluster; their variables are gone.
func (c *InProcessCluster) Close() error {
	var errs []error
	for _, t := range c.tasks {
		errs = append(errs, t.stop())
	}
	c.tasks = nil
	return errors.Join(errs...)
}

// security returns the TLS configuration of this task's traffic: WithTLS's,
// else that of the certificate files the environment names, else none (an
// error when the environment requires TLS).
func (c config) security(log *zap.Logger) (*tls.Config, error) {
	cfg, creds, err := mtls.Resolve(c.tls, os.LookupEnv, mtls.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("paramserver: %w", err)
	}
	if creds != nil {
		log.Info("traffic between tasks is mutual TLS", zap.Stringer("identity", creds.Identity()),
			zap.String("certificate", creds.Files().Cert))
	}
	return cfg, nil
}
