package allreducebench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/mtls"
)

// Exec is how a benchmark starts its processes: a program that calls
// RunRole first thing.
type Exec struct {
	Path string   // the executable
	Args []string // its arguments, if it needs any
	// Env is added to this process's environment, which the processes
	// inherit.
	Env []string
	// Net, if set, runs worker w on emulated host w, at its address,
	// where the traffic between workers crosses the network's links;
	// else every worker runs on 127.0.0.1.
	Net *emunet.Network
}

// benchPort is a worker's port on an emulated host, which it has alone.
const benchPort = 2222

// addresses returns the address of each of workers workers: a free port
// on 127.0.0.1, or on an emulated host its own.
func (x Exec) addresses(workers int) ([]string, error) {
	addrs := make([]string, workers)
	if x.Net != nil {
		if x.Net.Len() < workers {
			return nil, fmt.Errorf("%d workers on an emulated network of %d hosts: expected a host for each", workers, x.Net.Len())
		}
		for w := range addrs {
			addrs[w] = net.JoinHostPort(x.Net.Addr(w).String(), strconv.Itoa(benchPort))
		}
		return addrs, nil
	}
	ports, err := freeport.Loopback(workers)
	if err != nil {
		return nil, err
	}
	for w, p := range ports {
		addrs[w] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs, nil
}

// defaultEnv is the environment every benchmark process starts from, before
// this process's own and Exec.Env, which override it: glibc's malloc arenas
// limited as tfdist launch limits them, and TensorFlow's logging down to
// errors, since a process's output is only shown when it fails.
var defaultEnv = []string{"MALLOC_ARENA_MAX=2", "TF_CPP_MIN_LOG_LEVEL=2"}

// command returns the process x starts in role on host (on emulated host
// host, with x.Net; else here), with extra in its environment.
func (x Exec) command(ctx context.Context, host int, role string, extra ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, x.Path, x.Args...)
	if x.Net != nil {
		cmd = x.Net.Command(ctx, host, x.Path, x.Args...)
	}
	cmd.Env = slices.Concat(defaultEnv, os.Environ(), x.Env, []string{RoleEnv + "=" + role}, extra)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Result is the outcome of one all-reduce measurement.
type Result struct {
	// Line is worker 0's JSON line as it printed it, without the newline.
	Line    string
	Timings []Timing
}

// tailLines is how many of a failed process's last output lines an error
// quotes.
const tailLines = 20

// AllReduce runs an all-reduce measurement: it picks a free port on
// 127.0.0.1 for each of workers worker processes, writes each one's
// TF_CONFIG, starts them as x in RoleAllReduce with c, waits for all of
// them and returns worker 0's timings. When a worker fails, the others are
// stopped and the error names it and quotes its last output lines; when ctx
// ends first, the error names the workers still running.
func AllReduce(ctx context.Context, x Exec, workers int, c Config) (Result, error) {
	if workers < 2 {
		return Result{}, fmt.Errorf("%d workers: expected at least 2", workers)
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if err := c.Check(); err != nil {
		return Result{}, err
	}
	cfg, err := json.Marshal(c)
	if err != nil {
		return Result{}, err
	}
	addrs, err := x.addresses(workers)
	if err != nil {
		return Result{}, err
	}
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: addrs})
	if err != nil {
		return Result{}, err
	}

	tlsEnv, cleanup, err := certificates(c, spec)
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	procs := make([]*process, workers)
	for w := range procs {
		task := cluster.Task{Type: cluster.Worker, Index: w}
		tfConfig, err := cluster.Marshal(spec, task)
		if err != nil {
			return Result{}, err
		}
		p := &process{name: fmt.Sprintf("worker %d of %d", w, workers)}
		p.cmd = x.command(runCtx, w, RoleAllReduce, append(tlsEnv[task], "TF_CONFIG="+tfConfig, ConfigEnv+"="+string(cfg))...)
		p.cmd.Stdout, p.cmd.Stderr = io.MultiWriter(&p.stdout, &p.out), &p.out
		procs[w] = p
	}
	type exit struct {
		w   int
		err error
	}
	exits := make(chan exit, workers)
	for w, p := range procs {
		if err := p.cmd.Start(); err != nil {
			stop()
			for range w {
				<-exits
			}
			return Result{}, fmt.Errorf("starting %s: %w", p.name, err)
		}
		go func() { exits <- exit{w, p.cmd.Wait()} }()
	}
	var failed error
	for range workers {
		e := <-exits
		if runCtx.Err() == nil {
			procs[e.w].exited = true
		}
		if e.err != nil && failed == nil && runCtx.Err() == nil {
			failed = procs[e.w].failure(e.err)
			stop()
		}
	}
	if failed != nil {
		return Result{}, failed
	}
	var running strings.Builder
	for _, p := range procs {
		if !p.exited {
			fmt.Fprintf(&running, "\n%s was still running; its last output:\n%s", p.name, p.tail())
		}
	}
	if running.Len() > 0 {
		return Result{}, fmt.Errorf("all-reduce workers: %w%s", context.Cause(ctx), running.String())
	}
	return parseResult(procs[0])
}

// parseResult reads the timings worker 0 printed.
func parseResult(p *process) (Result, error) {
	var line string
	for _, l := range strings.Split(p.stdout.String(), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "[") {
			line = l
		}
	}
	if line == "" {
		return Result{}, fmt.Errorf("%s printed no timings; its last output:\n%s", p.name, p.tail())
	}
	var ts []Timing
	if err := json.Unmarshal([]byte(line), &ts); err != nil {
		return Result{}, fmt.Errorf("%s's timings %q: %w", p.name, line, err)
	}
	return Result{Line: line, Timings: ts}, nil
}

// process is one started benchmark process and its output.
type process struct {
	name   string
	cmd    *exec.Cmd
	stdout syncbuf.Buffer // its stdout
	out    syncbuf.Buffer // its stdout and stderr, interleaved
	exited bool           // whether it exited by itself
}

// failure is the error of p's exit with err, with p's last output lines.
func (p *process) failure(err error) error {
	return fmt.Errorf("%s failed: %w; its last output:\n%s", p.name, err, p.tail())
}

// tail returns p's last output lines, indented.
func (p *process) tail() string {
	lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return "\t(none)"
	}
	lines = lines[max(0, len(lines)-tailLines):]
	return "\t" + strings.Join(lines, "\n\t")
}

// TCPBytes is the size of the TCP copy benchmarks take for reference: large
// enough that the connection's setup does not count.
const TCPBytes = 256 << 20

// TCPBandwidth copies n bytes over one TCP connection on 127.0.0.1 from a
// process x starts in RoleTCPSend (here, whatever x.Net) to this one and
// returns the bytes per second the copy reached, timed from the
// connection's accept to its end.
func TCPBandwidth(ctx context.Context, x Exec, n int64) (float64, error) {
	x.Net = nil // the copy is between processes of this host
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("tcp copy: %w", err)
	}
	defer l.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	p := &process{name: "tcp sender"}
	p.cmd = x.command(runCtx, 0, RoleTCPSend, AddrEnv+"="+l.Addr().String(), fmt.Sprintf("%s=%d", BytesEnv, n))
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		return 0, fmt.Errorf("tcp copy: starting the sender: %w", err)
	}
	// A sender that fails, or the end of ctx, ends the accept and the copy.
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = p.cmd.Wait()
		if waitErr != nil {
			stop()
		}
		close(exited)
	}()
	defer context.AfterFunc(runCtx, func() { l.Close() })()
	fail := func(err error) (float64, error) {
		stop()
		<-exited
		switch {
		case ctx.Err() != nil:
			return 0, fmt.Errorf("tcp copy: %w", ctx.Err())
		case waitErr != nil:
			return 0, fmt.Errorf("tcp copy: %w", p.failure(waitErr))
		}
		return 0, fmt.Errorf("tcp copy: %w", err)
	}

	conn, err := l.Accept()
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	defer context.AfterFunc(runCtx, func() { conn.Close() })()
	start := time.Now()
	got, err := io.Copy(io.Discard, conn)
	elapsed := time.Since(start)
	if err != nil {
		return fail(err)
	}
	<-exited
	if waitErr != nil || ctx.Err() != nil {
		return fail(nil)
	}
	if got != n {
		return 0, fmt.Errorf("tcp copy: received %d of %d bytes", got, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// TCPSend writes n bytes to addr over one TCP connection.
func TCPSend(ctx context.Context, addr string, n int64) error {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, 1<<20)
	for sent := int64(0); sent < n; {
		k, err := conn.Write(buf[:min(int64(len(buf)), n-sent)])
		sent += int64(k)
		if err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", sent, n, err)
		}
	}
	return conn.Close()
}

// certificates makes, when c asks for TLS, a CA and a certificate per
// worker of spec in a temporary directory, which cleanup removes, and
// returns each worker's environment naming its files.
func certificates(c Config, spec cluster.ClusterSpec) (env map[cluster.Task][]string, cleanup func(), err error) {
	if !c.TLS {
		return nil, func() {}, nil
	}
	files, _, cleanup, err := mtls.WriteTempTasks("tfdist-allreducebench-tls-", "allreducebench", spec.Tasks(), time.Hour)
	if err != nil {
		return nil, nil, err
	}
	env = make(map[cluster.Task][]string, len(files))
	for t, f := range files {
		env[t] = f.Env(true)
	}
	return env, cleanup, nil
}
