package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/mtls"
)

// Environment variables the launcher sets in every task, besides TF_CONFIG.
const (
	EnvTaskType  = "TFDIST_TASK_TYPE"  // the task's type, e.g. "worker"
	EnvTaskIndex = "TFDIST_TASK_INDEX" // the task's index, e.g. "1"
	EnvRestart   = "TFDIST_RESTART"    // the task's restarts: 0 on its first run, n after n (of the cluster, or of the task alone)
)

// EnvMallocArenaMax is glibc's limit on its malloc arenas. The launcher
// sets it to DefaultMallocArenaMax in every task whose environment does not
// set it: TensorFlow's master starts a thread per step, and with glibc's
// default of 8 arenas per core a parameter-server chief's memory climbs by
// about half over its first minutes before it levels off.
const (
	EnvMallocArenaMax     = "MALLOC_ARENA_MAX"
	DefaultMallocArenaMax = "2"
)

// EnvLogLevel is the level of TensorFlow's C++ log. The launcher sets it to
// DefaultLogLevel (warnings and errors) in every task whose environment
// does not set it: a program that uses tfdist keeps that level by default
// anyway, but TensorFlow may log while its library loads, before the
// program can set it.
const (
	EnvLogLevel     = "TF_CPP_MIN_LOG_LEVEL"
	DefaultLogLevel = "1"
)

// DefaultGracePeriod is how long stopping tasks get between SIGTERM and
// SIGKILL unless WithGracePeriod says otherwise.
const DefaultGracePeriod = 10 * time.Second

// DefaultTaskRestarts is how many times a worker task of a parameter-server
// cluster is restarted unless WithTaskRestarts says otherwise.
const DefaultTaskRestarts = 3

// The delays before a task's restarts unless WithRestartBackoff says
// otherwise: the first, and the bound of its doubling.
const (
	DefaultRestartBackoff    = time.Second
	DefaultMaxRestartBackoff = 30 * time.Second
)

// Launcher runs one program as every task of a local cluster on 127.0.0.1.
// Build one with New and call Run once.
type Launcher struct {
	command     []string
	workers, ps int
	chief, eval bool
	maxRestarts int
	timeout     time.Duration
	grace       time.Duration
	basePort    int
	tls         bool
	ca          *mtls.Authority             // set by Run when tls
	tlsDir      string                      // where the CA's files are written
	tlsFiles    map[cluster.Task]mtls.Files // every task's, as issued
	timeline    string                      // the merged trace's file, or ""
	timelineDir string                      // the tasks' traces, made by Run when timeline is set
	env         []string
	dir         string
	stdout      io.Writer
	stderr      io.Writer
	log         *zap.Logger
	onStart     func(t cluster.Task, attempt, pid int)

	// Each task's metrics address, set by each attempt when metrics.
	metrics      bool
	metricsAddrs map[cluster.Task]string

	// A worker of a parameter-server cluster restarts on its own.
	taskRestarts        int
	backoff, maxBackoff time.Duration

	// An elastic job: its bounds, and, once Run starts it, its name and
	// rendezvous's address.
	elastic                bool
	minWorkers, maxWorkers int
	sizes                  []int
	membershipLog          io.Writer          // where the rendezvous logs memberships
	replay                 []elastic.LogEntry // the memberships to replay
	job, rendezvous        string
	scales                 chan int

	// With WithLink, the tasks' emulated hosts, made by Run.
	link *emunet.Link
	net  *emunet.Network

	sigs chan os.Signal
	mu   sync.Mutex
	sig  os.Signal // the first signal Signal forwarded
}

// Option configures a Launcher.
type Option func(*Launcher)

// WithWorkers sets the number of worker tasks (default 1).
func WithWorkers(n int) Option { return func(l *Launcher) { l.workers = n } }

// WithChief adds a chief task.
func WithChief(on bool) Option { return func(l *Launcher) { l.chief = on } }

// WithPS sets the number of parameter-server tasks. A cluster with ps tasks
// is a parameter-server cluster: it needs a chief and a worker, and ends when
// the chief ends.
func WithPS(n int) Option { return func(l *Launcher) { l.ps = n } }

// WithEvaluator adds an evaluator task.
func WithEvaluator(on bool) Option { return func(l *Launcher) { l.eval = on } }

// WithMaxRestarts lets the launcher restart the whole cluster up to k times
// after a task fails, as torchrun does.
func WithMaxRestarts(k int) Option { return func(l *Launcher) { l.maxRestarts = k } }

// WithTaskRestarts sets how many times each worker task of a
// parameter-server cluster is restarted on its own, at its own address,
// after it exits while the chief runs (default DefaultTaskRestarts). The
// chief's coordinator takes the restarted worker back and reruns the step
// the dead one was running. A worker that exits once more ends the attempt
// with its exit, so 0 ends it at the first worker exit. Other clusters, and
// the chief and ps tasks, restart only as a whole cluster (WithMaxRestarts).
func WithTaskRestarts(n int) Option { return func(l *Launcher) { l.taskRestarts = n } }

// WithRestartBackoff sets the delays before a task's restarts
// (WithTaskRestarts): initial before its first, doubling with each restart
// up to limit (default DefaultRestartBackoff to DefaultMaxRestartBackoff).
func WithRestartBackoff(initial, limit time.Duration) Option {
	return func(l *Launcher) { l.backoff, l.maxBackoff = initial, limit }
}

// WithTimeout bounds the whole run, restarts included; 0 (the default) means
// no bound.
func WithTimeout(d time.Duration) Option { return func(l *Launcher) { l.timeout = d } }

// WithGracePeriod sets how long tasks being stopped get between SIGTERM (or
// the forwarded signal) and SIGKILL.
func WithGracePeriod(d time.Duration) Option { return func(l *Launcher) { l.grace = d } }

// WithBasePort gives the tasks ports p, p+1, … in task order instead of free
// ports picked at random; the same ports serve every attempt.
func WithBasePort(p int) Option { return func(l *Launcher) { l.basePort = p } }

// WithCertificates, when on, makes a CA and a certificate per task in a
// temporary directory, removed when Run returns, and hands each task its
// own files (mtls.EnvCA, EnvCert, EnvKey) and mtls.EnvRequire=1, so that
// traffic between tasks is mutual TLS or the program refuses to start.
// The certificates are valid for mtls.DefaultLifetime, or the run's
// timeout if longer.
func WithCertificates(on bool) Option { return func(l *Launcher) { l.tls = on } }

// WithTimeline gathers the tasks' step timelines into the file path, a
// Chrome trace with one track per task in task order. Each task is told,
// in timeline.Env, a file of its own to write its trace to when it ends (the
// multi-worker strategy does); when Run ends, whatever the outcome, the
// traces written are merged and renamed over path. Run first checks that
// path can be written, before any task starts; a task that writes no trace
// is logged, not a failure.
func WithTimeline(path string) Option { return func(l *Launcher) { l.timeline = path } }

// WithMetrics, when on, gives each task a loopback address of its own to
// serve its Prometheus metrics on, in monitoring.Env, and logs each task's
// URL when the cluster starts. The ports are picked as the tasks' are, on
// each attempt; with WithBasePort they follow the tasks' ports, in task
// order.
func WithMetrics(on bool) Option { return func(l *Launcher) { l.metrics = on } }

// WithEnv sets the environment every task starts from (default
// os.Environ()); the launcher adds TF_CONFIG and its TFDIST_ variables.
func WithEnv(env []string) Option { return func(l *Launcher) { l.env = slices.Clone(env) } }

// WithDir sets the tasks' working directory (default the launcher's).
func WithDir(dir string) Option { return func(l *Launcher) { l.dir = dir } }

// WithOutput sets where the tasks' prefixed output goes (default
// os.Stdout and os.Stderr).
func WithOutput(stdout, stderr io.Writer) Option {
	return func(l *Launcher) { l.stdout, l.stderr = stdout, stderr }
}

// WithLogger sets the logger of the launcher's own events (default none).
func WithLogger(log *zap.Logger) Option { return func(l *Launcher) { l.log = log } }

// WithOnStart calls fn with each task's process id whenever the launcher
// starts the task: attempt is the task's TFDIST_RESTART, 0 on its first
// start, then one more per restart, of the cluster or of the task alone.
// fn runs on Run's goroutine, before the launcher waits for the process,
// and must return promptly.
func WithOnStart(fn func(t cluster.Task, attempt, pid int)) Option {
	return func(l *Launcher) { l.onStart = fn }
}

// New returns a launcher that runs command (a program and its arguments) as
// every task of the cluster the options describe, or an error naming the
// option that makes no sense.
func New(command []string, opts ...Option) (*Launcher, error) {
	l := &Launcher{command: slices.Clone(command), workers: 1, grace: DefaultGracePeriod,
		taskRestarts: DefaultTaskRestarts, backoff: DefaultRestartBackoff, maxBackoff: DefaultMaxRestartBackoff,
		stdout: os.Stdout, stderr: os.Stderr, sigs: make(chan os.Signal, 8), scales: make(chan int, 8)}
	for _, o := range opts {
		o(l)
	}
	l.log = logging.OrNop(l.log)
	if l.env == nil {
		l.env = os.Environ()
	}
	switch {
	case len(l.command) == 0 || l.command[0] == "":
		return nil, errors.New("no program to run: name it after --, e.g. -- go run ./examples/classifier")
	case l.workers < 0:
		return nil, fmt.Errorf("workers: %d, expected >= 0", l.workers)
	case l.ps < 0:
		return nil, fmt.Errorf("ps: %d, expected >= 0", l.ps)
	case !l.chief && l.workers == 0:
		return nil, errors.New("workers: 0 and no chief: the cluster has no task that runs the program's training")
	case l.ps > 0 && !l.chief:
		return nil, fmt.Errorf("ps: %d without a chief: a parameter-server cluster needs a chief, its coordinator (add --chief)", l.ps)
	case l.ps > 0 && l.workers == 0:
		return nil, fmt.Errorf("ps: %d with no workers: a parameter-server cluster needs at least one worker", l.ps)
	case l.maxRestarts < 0:
		return nil, fmt.Errorf("max restarts: %d, expected >= 0", l.maxRestarts)
	case l.taskRestarts < 0:
		return nil, fmt.Errorf("task restarts: %d, expected >= 0 (0 never restarts a task on its own)", l.taskRestarts)
	case l.backoff <= 0 || l.maxBackoff < l.backoff:
		return nil, fmt.Errorf("restart backoff: %v to %v, expected 0 < initial <= limit", l.backoff, l.maxBackoff)
	case l.timeout < 0:
		return nil, fmt.Errorf("timeout: %v, expected >= 0 (0 means none)", l.timeout)
	case l.grace <= 0:
		return nil, fmt.Errorf("grace period: %v, expected > 0", l.grace)
	}
	if err := l.checkElastic(); err != nil {
		return nil, err
	}
	if err := l.checkLink(); err != nil {
		return nil, err
	}
	switch {
	case l.basePort < 0 || l.basePort > 0 && l.basePort+l.numPorts()-1 > 65535:
		return nil, fmt.Errorf("base port: %d, expected 1..%d for %d tasks (%d ports)",
			l.basePort, 65536-l.numPorts(), len(l.Tasks()), l.numPorts())
	}
	return l, nil
}

// Tasks returns the cluster's tasks in order: chief, workers, ps, evaluator.
func (l *Launcher) Tasks() []cluster.Task {
	var out []cluster.Task
	add := func(t cluster.TaskType, n int) {
		for i := range n {
			out = append(out, cluster.Task{Type: t, Index: i})
		}
	}
	add(cluster.Chief, boolInt(l.chief))
	add(cluster.Worker, l.workers)
	add(cluster.PS, l.ps)
	add(cluster.Evaluator, boolInt(l.eval))
	return out
}

// paramServer reports whether the cluster is a parameter-server cluster,
// whose servers are ended when the chief ends.
func (l *Launcher) paramServer() bool { return l.ps > 0 }

// Signal forwards sig to every running task's process group and stops the
// run: the tasks get the grace period, then SIGKILL, and there is no
// restart. A second signal kills at once. Signal is safe to call from any
// goroutine, before or during Run.
func (l *Launcher) Signal(sig os.Signal) {
	l.mu.Lock()
	if l.sig == nil {
		l.sig = sig
	}
	l.mu.Unlock()
	select {
	case l.sigs <- sig:
	default:
	}
}

func (l *Launcher) interrupted() os.Signal {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sig
}

var errTimeout = errors.New("launch timeout")

// Run starts the cluster and waits for it. It returns nil when every task
// exits with status 0, or, for a parameter-server cluster, when the chief
// does (the other tasks, which serve forever, are then stopped). Otherwise
// it returns a *TaskError for the task that failed (after the restarts
// WithMaxRestarts and WithTaskRestarts allow), a *TimeoutError, an *InterruptedError after Signal, or the
// context's error; ExitCode maps each to the launcher's exit status. Every
// task's process group is gone when Run returns. With WithTimeline, an
// unwritable timeline file is an error before any task starts, and failing
// to write it at the end is the error of a run that otherwise succeeded.
func (l *Launcher) Run(ctx context.Context) (err error) {
	if l.timeline != "" {
		if err := l.prepareTimeline(); err != nil {
			return err
		}
		defer func() { err = l.gatherTimeline(err) }()
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, l.timeout, errTimeout)
		defer cancel()
	}
	l.job = "launch-" + uuid.NewString()[:8]
	if l.tls {
		cleanup, err := l.makeCertificates()
		if err != nil {
			return err
		}
		defer cleanup()
	}
	if l.link != nil {
		cleanup, err := l.makeHosts()
		if err != nil {
			return err
		}
		defer cleanup()
	}
	if l.elastic {
		return l.attemptElastic(ctx)
	}
	for attempt := 0; ; attempt++ {
		if sig := l.interrupted(); sig != nil {
			return &InterruptedError{Signal: sig}
		}
		if context.Cause(ctx) == errTimeout {
			return &TimeoutError{Timeout: l.timeout}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		err := l.attempt(ctx, attempt)
		var te *TaskError
		if err == nil || !errors.As(err, &te) || attempt >= l.maxRestarts {
			return err
		}
		l.log.Warn("restarting the cluster after a failure",
			zap.Stringer("failed", te.Task), zap.Int("restart", attempt+1), zap.Int("max_restarts", l.maxRestarts))
	}
}

// ports returns n loopback ports, for what portUser says: base, base+1, …
// when a base port is set, else free ports below the ephemeral range
// (freeport.Loopback).
func (l *Launcher) ports(n int) ([]int, error) {
	ports := make([]int, 0, n)
	if l.basePort > 0 {
		for i := range n {
			p := l.basePort + i
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				return nil, fmt.Errorf("base port %d: port %d (for %s) is not free: %w", l.basePort, p, l.portUser(i), err)
			}
			ln.Close()
			ports = append(ports, p)
		}
		return ports, nil
	}
	return freeport.Loopback(n)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// makeCertificates makes a CA for the run, in a new private directory,
// and the certificate of every task (and of an elastic job's rendezvous);
// cleanup removes the directory.
func (l *Launcher) makeCertificates() (cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "tfdist-launch-tls-")
	if err != nil {
		return nil, fmt.Errorf("TLS certificates: %w", err)
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	l.tlsDir, l.tlsFiles = dir, map[cluster.Task]mtls.Files{}
	tasks := l.Tasks()
	if l.elastic {
		tasks = append(tasks, mtls.RendezvousTask)
	}
	if l.ca, err = mtls.NewAuthority("tfdist CA for job "+l.job, max(mtls.DefaultLifetime, l.timeout)); err == nil {
		for _, t := range tasks {
			if _, err = l.certificate(t); err != nil {
				break
			}
		}
	}
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("TLS certificates: %w", err)
	}
	l.log.Info("TLS certificates made for the run", zap.String("job", l.job), zap.String("dir", dir))
	return cleanup, nil
}

// certificate returns t's certificate files, issuing them the first time:
// an elastic job's workers beyond the first get theirs as they start.
func (l *Launcher) certificate(t cluster.Task) (mtls.Files, error) {
	if f, ok := l.tlsFiles[t]; ok {
		return f, nil
	}
	nb, na := l.ca.Validity()
	files, err := l.ca.Write(l.tlsDir, []mtls.Identity{{Job: l.job, Task: t}}, nb, na)
	if err != nil {
		return mtls.Files{}, err
	}
	l.tlsFiles[t] = files[0]
	return files[0], nil
}

// tlsEnv returns the environment that gives t its TLS files, if the run
// makes them.
func (l *Launcher) tlsEnv(t cluster.Task) ([]string, error) {
	if !l.tls {
		return nil, nil
	}
	f, err := l.certificate(t)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate of %s: %w", t, err)
	}
	return f.Env(true), nil
}
