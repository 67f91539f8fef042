package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/logging"
)

// Environment variables the launcher sets in every task, besides TF_CONFIG.
const (
	EnvTaskType  = "TFDIST_TASK_TYPE"  // the task's type, e.g. "worker"
	EnvTaskIndex = "TFDIST_TASK_INDEX" // the task's index, e.g. "1"
	EnvRestart   = "TFDIST_RESTART"    // the attempt: 0 on the first run, n after n restarts
)

// DefaultGracePeriod is how long stopping tasks get between SIGTERM and
// SIGKILL unless WithGracePeriod says otherwise.
const DefaultGracePeriod = 10 * time.Second

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
	env         []string
	dir         string
	stdout      io.Writer
	stderr      io.Writer
	log         *zap.Logger
	onStart     func(t cluster.Task, attempt, pid int)

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

// WithTimeout bounds the whole run, restarts included; 0 (the default) means
// no bound.
func WithTimeout(d time.Duration) Option { return func(l *Launcher) { l.timeout = d } }

// WithGracePeriod sets how long tasks being stopped get between SIGTERM (or
// the forwarded signal) and SIGKILL.
func WithGracePeriod(d time.Duration) Option { return func(l *Launcher) { l.grace = d } }

// WithBasePort gives the tasks ports p, p+1, … in task order instead of free
// ports picked at random; the same ports serve every attempt.
func WithBasePort(p int) Option { return func(l *Launcher) { l.basePort = p } }

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
// starts the task (attempt 0 first, then once per restart), e.g. to watch
// the processes of a run.
func WithOnStart(fn func(t cluster.Task, attempt, pid int)) Option {
	return func(l *Launcher) { l.onStart = fn }
}

// New returns a launcher that runs command (a program and its arguments) as
// every task of the cluster the options describe, or an error naming the
// option that makes no sense.
func New(command []string, opts ...Option) (*Launcher, error) {
	l := &Launcher{command: slices.Clone(command), workers: 1, grace: DefaultGracePeriod,
		stdout: os.Stdout, stderr: os.Stderr, sigs: make(chan os.Signal, 8)}
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
	case l.timeout < 0:
		return nil, fmt.Errorf("timeout: %v, expected >= 0 (0 means none)", l.timeout)
	case l.grace <= 0:
		return nil, fmt.Errorf("grace period: %v, expected > 0", l.grace)
	case l.basePort < 0 || l.basePort > 0 && l.basePort+len(l.Tasks())-1 > 65535:
		return nil, fmt.Errorf("base port: %d, expected 1..%d for %d tasks", l.basePort, 65536-len(l.Tasks()), len(l.Tasks()))
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
// it returns a *TaskError for the task that failed (after restarts, if
// allowed), a *TimeoutError, an *InterruptedError after Signal, or the
// context's error; ExitCode maps each to the launcher's exit status. Every
// task's process group is gone when Run returns.
func (l *Launcher) Run(ctx context.Context) error {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, l.timeout, errTimeout)
		defer cancel()
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

// proc is one running task.
type proc struct {
	task    cluster.Task
	cmd     *exec.Cmd
	pgid    int
	readers []*os.File
	pumps   sync.WaitGroup
	done    bool
}

type exitEvent struct {
	p     *proc
	state *os.ProcessState
	err   error
}

// attempt runs the cluster once.
func (l *Launcher) attempt(ctx context.Context, attempt int) error {
	tasks := l.Tasks()
	ports, err := l.ports(len(tasks))
	if err != nil {
		return err
	}
	addrs := map[cluster.TaskType][]string{}
	for i, t := range tasks {
		addrs[t.Type] = append(addrs[t.Type], net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])))
	}
	spec, err := cluster.NewClusterSpec(addrs)
	if err != nil {
		return fmt.Errorf("build the cluster spec: %w", err)
	}
	l.log.Info("starting the cluster", zap.Int("attempt", attempt), zap.Stringer("cluster", spec),
		zap.Stringer("fingerprint", spec.Fingerprint()))

	out := &syncWriters{stdout: l.stdout, stderr: l.stderr}
	exits := make(chan exitEvent, len(tasks))
	var procs []*proc
	defer func() { l.sweep(procs, exits) }()
	for _, t := range tasks {
		p, err := l.start(spec, t, attempt, out, exits)
		if err != nil {
			return fmt.Errorf("start %s: %w", t, err)
		}
		procs = append(procs, p)
	}

	var (
		result    error
		stopping  bool
		killTimer <-chan time.Time
		ctxDone   = ctx.Done()
		running   = len(procs)
	)
	stop := func(reason error, sig syscall.Signal) {
		if stopping {
			return
		}
		stopping, result = true, reason
		for _, p := range procs {
			if !p.done {
				signalGroup(p.pgid, sig)
			}
		}
		killTimer = time.After(l.grace)
	}
	for running > 0 {
		select {
		case ev := <-exits:
			running--
			ev.p.done = true
			l.log.Info("task exited", zap.Stringer("task", ev.p.task), zap.Stringer("status", ev.state), zap.Int("attempt", attempt))
			if stopping {
				continue
			}
			if reason, end := l.judge(ev, attempt); end {
				stop(reason, syscall.SIGTERM)
			}
		case <-ctxDone:
			ctxDone = nil
			var reason error = ctx.Err()
			if context.Cause(ctx) == errTimeout {
				reason = &TimeoutError{Timeout: l.timeout, Running: runningTasks(procs)}
			}
			l.log.Warn("stopping the cluster", zap.Error(reason))
			stop(reason, syscall.SIGTERM)
		case sig := <-l.sigs:
			if stopping {
				l.log.Warn("second signal: killing every task", zap.Stringer("signal", sig))
				for _, p := range procs {
					signalGroup(p.pgid, syscall.SIGKILL)
				}
				continue
			}
			s, ok := sig.(syscall.Signal)
			if !ok {
				s = syscall.SIGTERM
			}
			l.log.Info("forwarding signal to every task", zap.Stringer("signal", sig))
			stop(&InterruptedError{Signal: sig}, s)
		case <-killTimer:
			killTimer = nil
			l.log.Warn("grace period over: killing the tasks still running",
				zap.Duration("grace", l.grace), zap.Stringers("tasks", runningTasks(procs)))
			for _, p := range procs {
				if !p.done {
					signalGroup(p.pgid, syscall.SIGKILL)
				}
			}
		}
	}
	return result
}

// judge decides, for a task that exited while nothing was stopping, whether
// the attempt ends, and with which result.
func (l *Launcher) judge(ev exitEvent, attempt int) (error, bool) {
	t := ev.p.task
	failed := !ev.state.Success()
	if !l.paramServer() {
		if failed {
			return newTaskError(t, attempt, ev.state, ""), true
		}
		return nil, false
	}
	switch t.Type {
	case cluster.Chief:
		if failed {
			return newTaskError(t, attempt, ev.state, ""), true
		}
		return nil, true // success: the servers are no longer needed
	case cluster.PS:
		return newTaskError(t, attempt, ev.state,
			"while the chief was running; a parameter server must serve until the chief ends"), true
	default:
		// The coordinator of parameter-server training tolerates losing a
		// worker, as TensorFlow's does: the chief decides.
		l.log.Warn("task exited while the chief was running; the chief carries on without it",
			zap.Stringer("task", t), zap.Stringer("status", ev.state))
		return nil, false
	}
}

// start starts one task in its own process group, its output prefixed.
func (l *Launcher) start(spec cluster.ClusterSpec, t cluster.Task, attempt int, out *syncWriters, exits chan<- exitEvent) (*proc, error) {
	tfConfig, err := cluster.Marshal(spec, t)
	if err != nil {
		return nil, err
	}
	env := slices.DeleteFunc(slices.Clone(l.env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == cluster.EnvVar || k == EnvTaskType || k == EnvTaskIndex || k == EnvRestart
	})
	env = append(env,
		cluster.EnvVar+"="+tfConfig,
		EnvTaskType+"="+string(t.Type),
		EnvTaskIndex+"="+strconv.Itoa(t.Index),
		EnvRestart+"="+strconv.Itoa(attempt),
	)
	rOut, wOut, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	rErr, wErr, err := os.Pipe()
	if err != nil {
		rOut.Close()
		wOut.Close()
		return nil, err
	}
	cmd := exec.Command(l.command[0], l.command[1:]...)
	cmd.Env = env
	cmd.Dir = l.dir
	cmd.Stdout, cmd.Stderr = wOut, wErr
	// Its own process group, so that a signal reaches everything the task
	// starts (go run's child, a shell's children); and killed should the
	// launcher die without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	wOut.Close()
	wErr.Close()
	if err != nil {
		rOut.Close()
		rErr.Close()
		return nil, err
	}
	p := &proc{task: t, cmd: cmd, pgid: cmd.Process.Pid, readers: []*os.File{rOut, rErr}}
	prefix := "[" + t.String() + "] "
	p.pumps.Add(2)
	go func() { defer p.pumps.Done(); out.pump(rOut, false, prefix) }()
	go func() { defer p.pumps.Done(); out.pump(rErr, true, prefix) }()
	l.log.Info("started task", zap.Stringer("task", t), zap.Int("pid", p.pgid), zap.Int("attempt", attempt))
	if l.onStart != nil {
		l.onStart(t, attempt, p.pgid)
	}
	go func() {
		err := cmd.Wait()
		exits <- exitEvent{p: p, state: cmd.ProcessState, err: err}
	}()
	return p, nil
}

// sweep ends what is left of an attempt: it kills every task's process
// group (leaders that already exited may have left children), reaps the
// leaders still running and drains their output.
func (l *Launcher) sweep(procs []*proc, exits <-chan exitEvent) {
	for _, p := range procs {
		signalGroup(p.pgid, syscall.SIGKILL)
	}
	for _, p := range procs {
		for !p.done {
			ev := <-exits
			ev.p.done = true
		}
	}
	for _, p := range procs {
		drained := make(chan struct{})
		go func() { p.pumps.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			// A process outside the group still holds the pipe open.
			for _, r := range p.readers {
				r.Close()
			}
			<-drained
		}
		for _, r := range p.readers {
			r.Close()
		}
	}
}

// ports returns n loopback ports: base, base+1, … when a base port is set,
// else free ports picked by the kernel.
func (l *Launcher) ports(n int) ([]int, error) {
	ports := make([]int, 0, n)
	if l.basePort > 0 {
		tasks := l.Tasks()
		for i := range n {
			p := l.basePort + i
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				return nil, fmt.Errorf("base port %d: port %d (for %s) is not free: %w", l.basePort, p, tasks[i], err)
			}
			ln.Close()
			ports = append(ports, p)
		}
		return ports, nil
	}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free loopback port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// signalGroup sends sig to the process group pgid; a group that is gone is
// not an error.
func signalGroup(pgid int, sig syscall.Signal) {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, sig)
	}
}

func runningTasks(procs []*proc) []cluster.Task {
	var out []cluster.Task
	for _, p := range procs {
		if !p.done {
			out = append(out, p.task)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
