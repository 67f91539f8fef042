package launch

import (
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
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/timeline"
)

// proc is one process of a task.
type proc struct {
	task    cluster.Task
	index   int // the task's position in Tasks
	start   int // the task's TFDIST_RESTART
	cmd     *exec.Cmd
	pgid    int
	readers []*os.File
	pumps   sync.WaitGroup
	tail    tail
	done    bool // its exit has been seen
	drained bool // its output has been read to the end
	leaving bool // asked to leave an elastic job
}

type exitEvent struct {
	p     *proc
	state *os.ProcessState
	err   error
}

// drainTimeout is how long drain waits for a process's output to end once
// the process is gone: longer only when a process outside its group still
// holds its pipes.
const drainTimeout = 2 * time.Second

// start starts the task at position index, the start-th time (its
// TFDIST_RESTART), in its own process group, its output prefixed; its exit
// goes to exits.
func (l *Launcher) start(spec cluster.ClusterSpec, t cluster.Task, index, start int, out *syncWriters, exits chan<- exitEvent) (*proc, error) {
	var tfConfig string
	if !l.elastic {
		var err error
		if tfConfig, err = cluster.Marshal(spec, t); err != nil {
			return nil, err
		}
	}
	env := slices.DeleteFunc(slices.Clone(l.env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == cluster.EnvVar || k == EnvTaskType || k == EnvTaskIndex || k == EnvRestart ||
			k == timeline.Env || k == monitoring.Env || k == elastic.EnvRendezvous || k == elastic.EnvJob || k == elastic.EnvName || k == elastic.EnvHost ||
			l.tls && (k == mtls.EnvCA || k == mtls.EnvCert || k == mtls.EnvKey || k == mtls.EnvRequire)
	})
	if tfConfig != "" {
		env = append(env, cluster.EnvVar+"="+tfConfig)
	}
	env = append(env, l.elasticEnv(t)...)
	env = append(env, l.hostEnv(index)...)
	env = append(env,
		EnvTaskType+"="+string(t.Type),
		EnvTaskIndex+"="+strconv.Itoa(t.Index),
		EnvRestart+"="+strconv.Itoa(start),
	)
	tlsEnv, err := l.tlsEnv(t)
	if err != nil {
		return nil, err
	}
	env = append(env, tlsEnv...)
	env = append(env, l.timelineEnv(t, start)...)
	if err := l.assignElasticMetrics(t); err != nil {
		return nil, err
	}
	env = append(env, l.metricsEnv(t)...)
	for _, d := range [][2]string{{EnvMallocArenaMax, DefaultMallocArenaMax}, {EnvLogLevel, DefaultLogLevel}} {
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, d[0]+"=") }) {
			env = append(env, d[0]+"="+d[1])
		}
	}
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
	cmd := l.taskCommand(index)
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
	p := &proc{task: t, index: index, start: start, cmd: cmd, pgid: cmd.Process.Pid, readers: []*os.File{rOut, rErr}}
	prefix := "[" + t.String() + "] "
	p.pumps.Add(2)
	go func() { defer p.pumps.Done(); out.pump(rOut, false, prefix, &p.tail) }()
	go func() { defer p.pumps.Done(); out.pump(rErr, true, prefix, &p.tail) }()
	l.log.Info("started task", zap.Stringer("task", t), zap.Int("pid", p.pgid), zap.Int("attempt", start))
	if l.onStart != nil {
		l.onStart(t, start, p.pgid)
	}
	go func() {
		err := cmd.Wait()
		exits <- exitEvent{p: p, state: cmd.ProcessState, err: err}
	}()
	return p, nil
}

// drain waits until p's output has been read to the end, at most
// drainTimeout, and closes its pipes: its last lines are then written out
// and in its tail. The process must be gone.
func (p *proc) drain() {
	if p.drained {
		return
	}
	p.drained = true
	finished := make(chan struct{})
	go func() { p.pumps.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(drainTimeout):
		// A process outside the group still holds the pipe open.
		for _, r := range p.readers {
			r.Close()
		}
		<-finished
	}
	for _, r := range p.readers {
		r.Close()
	}
}

// sweep ends what is left of an attempt: it kills every task's process
// group (leaders that already exited may have left children), reaps the
// leaders still running and drains their output.
func sweep(procs []*proc, exits <-chan exitEvent) {
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
		p.drain()
	}
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
