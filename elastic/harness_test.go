package elastic_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tfdist/tfdist/elastic"
)

func TestMain(m *testing.M) {
	if os.Getenv(envWorker) != "" {
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m)
}

// job is a rendezvous and the worker processes of one test.
type job struct {
	t     *testing.T
	srv   *elastic.Server
	steps int
	serve chan error // Serve's result
	stop  context.CancelFunc

	mu    sync.Mutex
	cond  *sync.Cond
	procs []*proc
}

// proc is one worker process and what it printed.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	lines   []line
	exited  bool
	err     error
}

func startJob(t *testing.T, steps int, opts ...elastic.Option) *job {
	srv, err := elastic.Listen("127.0.0.1:0", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{t: t, srv: srv, steps: steps, serve: make(chan error, 1), stop: cancel}
	j.cond = sync.NewCond(&j.mu)
	go func() { j.serve <- srv.Serve(ctx) }()
	t.Cleanup(j.cleanup)
	return j
}

// start runs a worker process named name.
func (j *job) start(name string) *proc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorker+"="+name, envRendezvous+"="+j.srv.Addr(), envSteps+"="+strconv.Itoa(j.steps))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(j.t, err)
	p := &proc{name: name, cmd: cmd, started: time.Now()}
	require.NoError(j.t, cmd.Start())
	j.mu.Lock()
	j.procs = append(j.procs, p)
	j.mu.Unlock()
	go j.read(p, bufio.NewScanner(out))
	return p
}

func (j *job) read(p *proc, sc *bufio.Scanner) {
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		j.mu.Lock()
		p.lines = append(p.lines, l)
		j.cond.Broadcast()
		j.mu.Unlock()
	}
	err := p.cmd.Wait()
	j.mu.Lock()
	p.exited, p.err = true, err
	j.cond.Broadcast()
	j.mu.Unlock()
}

// waitFor waits, up to a minute, until ok holds of the processes.
func (j *job) waitFor(what string, ok func() bool) {
	timer := time.AfterFunc(time.Minute, func() {
		j.mu.Lock()
		j.cond.Broadcast()
		j.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(time.Minute)
	j.mu.Lock()
	for !ok() && time.Now().Before(deadline) {
		j.cond.Wait()
	}
	held, desc := ok(), j.describe()
	j.mu.Unlock()
	if !held {
		j.t.Fatalf("waited a minute for %s; %s", what, desc)
	}
}

// describe says what each process has done, for failures.
func (j *job) describe() string {
	s := ""
	for _, p := range j.procs {
		last := line{}
		if len(p.lines) > 0 {
			last = p.lines[len(p.lines)-1]
		}
		s += fmt.Sprintf("%s: exited %v (%v), last %+v; ", p.name, p.exited, p.err, last)
	}
	return s
}

// lastStep is the most steps any running process has completed.
func (j *job) lastStep() int64 {
	var n int64
	for _, p := range j.procs {
		for _, l := range p.lines {
			if l.Event == "step" && l.Step > n {
				n = l.Step
			}
		}
	}
	return n
}

// allExited says whether every process has exited.
func (j *job) allExited() bool {
	for _, p := range j.procs {
		if !p.exited {
			return false
		}
	}
	return true
}

func (j *job) cleanup() {
	j.mu.Lock()
	for _, p := range j.procs {
		if !p.exited {
			_ = p.cmd.Process.Kill()
		}
	}
	j.mu.Unlock()
	j.stop()
	<-j.serve
	j.waitFor("every worker to exit", j.allExited)
}

// first returns the first line of p after t that ok accepts.
func first(p *proc, after time.Time, ok func(line) bool) (line, bool) {
	for _, l := range p.lines {
		if l.Nanos > after.UnixNano() && ok(l) {
			return l, true
		}
	}
	return line{}, false
}
