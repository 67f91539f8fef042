package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/timeline"
)

// argsEnv, set, makes the test binary the command, run with its
// arguments (separated by spaces): a worker of the elastic tests.
const argsEnv = "TRANSFORMER_TEST_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(argsEnv); ok {
		os.Exit(Main(context.Background(), strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// elasticRun is the elastic tests' setting: tiny's model and data, over
// 60 steps in epochs of 2, topology-invariant on 4 virtual shards.
func elasticRun(t *testing.T) (options, []string) {
	o := tiny(t)
	o.steps, o.logEvery, o.sample = 60, 2, 0
	o.dist = distribute.Config{Strategy: "default", Deterministic: 4}
	args := []string{"-strategy", "elastic", "-devices", "1", "-deterministic", "4", "-corpus", o.corpus,
		"-train-bytes", strconv.Itoa(int(o.trainBytes)), "-eval-bytes", strconv.Itoa(int(o.evalBytes)),
		"-steps", strconv.Itoa(o.steps), "-log-every", strconv.Itoa(o.logEvery), "-global-batch", strconv.Itoa(o.globalBatch),
		"-seq-len", strconv.Itoa(o.seqLen), "-width", strconv.Itoa(o.width), "-heads", strconv.Itoa(o.heads),
		"-layers", strconv.Itoa(o.layers), "-warmup", strconv.Itoa(o.warmup), "-sample", "0", "-json"}
	return o, args
}

// worker is a worker process of an elastic job.
type worker struct {
	name    string
	started time.Time
	cmd     *exec.Cmd
	killed  bool
	mu      sync.Mutex
	step    int // the last "step N/M" line's N
	epochs  []epochLine
	report  string
	exited  chan struct{}
	err     error
}

// epochLine is when a worker printed an epoch's "step N/M" line.
type epochLine struct {
	step int
	at   time.Time
}

func startWorker(t *testing.T, addr, name string, args []string, env ...string) *worker {
	w := &worker{name: name, exited: make(chan struct{}), started: time.Now()}
	w.cmd = exec.Command(os.Args[0], "-test.run", "^$")
	w.cmd.Env = append(append(os.Environ(), env...), argsEnv+"="+strings.Join(args, " "),
		elastic.EnvRendezvous+"="+addr, elastic.EnvJob+"=transformer-test", elastic.EnvName+"="+name)
	w.cmd.Stderr = os.Stderr
	out, err := w.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	t.Cleanup(func() { _ = w.cmd.Process.Kill(); <-w.exited })
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			var n int
			if _, err := fmt.Sscanf(line, "step %d/", &n); err == nil {
				w.step = n
				w.epochs = append(w.epochs, epochLine{n, time.Now()})
			}
			if strings.HasPrefix(line, "{") {
				w.report = line
			}
			w.mu.Unlock()
		}
		w.err = w.cmd.Wait()
		close(w.exited)
	}()
	return w
}

func (w *worker) steps() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.step
}

var (
	chaosRuns    = flag.Int("chaos-runs", 1, "runs of each elastic chaos test (the issue's check is 10)")
	chaosWorkers = flag.Int("chaos-workers", 2, "workers of the elastic kill test (4 where the cores allow)")
)

// job is an elastic job of the command's worker processes and its
// rendezvous.
type job struct {
	t       *testing.T
	addr    string
	args    []string
	workers []*worker
}

// upTo are the rendezvous options of a job of at most max workers, whose
// memberships have 1, 2 or 4 (the sizes that divide -deterministic 4; a
// third waits as a standby).
func upTo(max int) []elastic.Option {
	return []elastic.Option{elastic.WithMembers(1, max),
		elastic.WithSizes(slices.DeleteFunc([]int{1, 2, 4}, func(n int) bool { return n > max })...)}
}

func newJob(t *testing.T, args []string, opts ...elastic.Option) *job {
	srv, err := elastic.Listen("127.0.0.1:0", append([]elastic.Option{elastic.WithJob("transformer-test")}, opts...)...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(served) }()
	t.Cleanup(func() { cancel(); <-served })
	return &job{t: t, addr: srv.Addr(), args: args}
}

func (j *job) start(name string, env ...string) *worker {
	w := startWorker(j.t, j.addr, name, j.args, env...)
	j.workers = append(j.workers, w)
	return w
}

// reachStep waits until a worker has printed step n or later.
func (j *job) reachStep(n int) {
	require.Eventually(j.t, func() bool {
		return slices.ContainsFunc(j.workers, func(w *worker) bool { return w.steps() >= n })
	}, 3*time.Minute, time.Millisecond, "step %d", n)
}

// end waits for every worker to exit successfully and returns the one
// report, the chief's.
func (j *job) end(what string) report {
	var reports []report
	for _, w := range j.workers {
		select {
		case <-w.exited:
		case <-time.After(3 * time.Minute):
			j.t.Fatalf("%s did not exit", w.name)
		}
		if w.killed {
			continue
		}
		require.NoError(j.t, w.err, "%s: %s", w.name, what)
		if w.report == "" {
			continue // not the chief, a leaver or a standby
		}
		var got report
		require.NoError(j.t, json.Unmarshal([]byte(w.report), &got))
		reports = append(reports, got)
	}
	require.Len(j.t, reports, 1, "the chief reports: %s", what)
	return reports[0]
}

// sameModel checks that got has want's model and losses, bit for bit.
func sameModel(t *testing.T, want, got report, what string) {
	assert.Equal(t, want.ParamsSHA256, got.ParamsSHA256, what)
	assert.Equal(t, want.TrainLosses, got.TrainLosses, "every epoch's loss: %s", what)
	assert.Equal(t, want.HeldOutLoss, got.HeldOutLoss, what)
}

// A Transformer trained as an elastic job that loses a worker at a random
// step and takes a replacement ends bit for bit with the model one device
// trains: the survivors go on in their own processes from the last step,
// in the same place in the data, and no window of the text is trained on
// twice or skipped. -chaos-runs runs it again, -chaos-workers sets the
// workers; it logs the time from each kill to the next epoch a survivor
// reports.
func TestElasticJobLosesNoBit(t *testing.T) {
	o, args := elasticRun(t)
	want := fitOn(t, o, o.dist)
	var heals []time.Duration
	for run := range *chaosRuns {
		j := newJob(t, args, upTo(*chaosWorkers)...)
		for i := range *chaosWorkers {
			j.start("worker:" + strconv.Itoa(i))
		}
		victim, at := j.workers[rand.IntN(len(j.workers))], 6+2*rand.IntN(15)
		j.reachStep(at)
		killed, step := time.Now(), victim.steps()
		require.NoError(t, victim.cmd.Process.Kill())
		victim.killed = true
		j.start(victim.name)
		what := fmt.Sprintf("run %d: %s killed after step %d", run, victim.name, at)
		sameModel(t, want, j.end(what), what)
		heals = append(heals, j.firstEpochAfter(killed, step))
	}
	slices.Sort(heals)
	t.Logf("kill → a survivor's next epoch: median %v, worst %v over %d runs", heals[len(heals)/2], heals[len(heals)-1], len(heals))
}

// firstEpochAfter is how long after t a worker first printed an epoch
// past step.
func (j *job) firstEpochAfter(t time.Time, step int) time.Duration {
	var first time.Time
	for _, w := range j.workers {
		w.mu.Lock()
		for _, e := range w.epochs {
			if e.step > step && e.at.After(t) && (first.IsZero() || e.at.Before(first)) {
				first = e.at
			}
		}
		w.mu.Unlock()
	}
	return first.Sub(t).Round(time.Millisecond)
}

// An elastic Transformer job of 2 workers that grows to 4, then loses one
// to a graceful leave (SIGTERM: it finishes its step and exits 0), ends
// with the bits one device trains.
func TestElasticJobScalesUpAndLeaves(t *testing.T) {
	o, args := elasticRun(t)
	want := fitOn(t, o, o.dist)
	for run := range *chaosRuns {
		j := newJob(t, args, upTo(4)...)
		j.start("worker:0")
		j.start("worker:1")
		j.reachStep(6 + 2*rand.IntN(5))
		j.start("worker:2")
		j.start("worker:3")
		j.reachStep(26 + 2*rand.IntN(5))
		leaver := j.workers[rand.IntN(2)] // a joiner may not have set up its SIGTERM handler yet
		require.NoError(t, leaver.cmd.Process.Signal(syscall.SIGTERM))
		what := fmt.Sprintf("run %d: %s left", run, leaver.name)
		sameModel(t, want, j.end(what), what)
	}
}

// Without -deterministic, a job that loses a worker at a random step and
// takes a replacement writes its membership log; replayed without the
// kill, Fit ends with the run's model, bit for bit.
func TestElasticReplayOfFit(t *testing.T) {
	_, args := elasticRun(t)
	args = slices.Clone(args)
	args[slices.Index(args, "-deterministic")+1] = "0"
	var log syncbuf.Buffer
	j := newJob(t, args, elastic.WithMembers(1, 2), elastic.WithLog(&log))
	j.start("worker:0")
	j.start("worker:1")
	victim, at := j.workers[rand.IntN(2)], 6+2*rand.IntN(15)
	j.reachStep(at)
	require.NoError(t, victim.cmd.Process.Kill())
	victim.killed = true
	j.start(victim.name)
	run := j.end(fmt.Sprintf("%s killed after step %d", victim.name, at))
	entries, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(entries), 2, "the kill changed the membership: %+v", entries)

	r := newJob(t, args, elastic.WithReplay(entries))
	r.start("worker:0")
	r.start("worker:1")
	sameModel(t, run, r.end("the replay"), fmt.Sprintf("the replay of %+v", entries))
}

// A worker that joins a running Transformer job (1 worker, then 2) takes
// its state and steps, and the job ends with one device's bits. It logs
// how long after its start the joiner completed its first step, from the
// trace it writes (TFDIST_TIMELINE): process start, TensorFlow's load,
// joining, the model's graph, Resume and the skipped batches included.
func TestElasticJoinerSteps(t *testing.T) {
	o, args := elasticRun(t)
	o.steps = 200
	args = slices.Clone(args)
	args[slices.Index(args, "-steps")+1] = strconv.Itoa(o.steps)
	want := fitOn(t, o, o.dist)
	var joins []time.Duration
	for run := range *chaosRuns {
		j := newJob(t, args, upTo(2)...)
		j.start("worker:0")
		j.reachStep(10)
		trace := filepath.Join(t.TempDir(), "joiner.json")
		joiner := j.start("worker:1", timeline.Env+"="+trace)
		what := fmt.Sprintf("run %d: a joiner after step 10", run)
		sameModel(t, want, j.end(what), what)
		joins = append(joins, firstStep(t, trace).Sub(joiner.started).Round(time.Millisecond))
	}
	slices.Sort(joins)
	t.Logf("a joiner's start → its first step: median %v, worst %v over %d runs", joins[len(joins)/2], joins[len(joins)-1], len(joins))
}

// firstStep is when the first step on the trace at path ended.
func firstStep(t *testing.T, path string) time.Time {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var tr struct {
		TraceEvents []struct {
			Cat string  `json:"cat"`
			TS  float64 `json:"ts"`  // µs since the Unix epoch
			Dur float64 `json:"dur"` // µs
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &tr))
	first := math.Inf(1)
	for _, e := range tr.TraceEvents {
		if e.Cat == string(timeline.Step) {
			first = min(first, e.TS+e.Dur)
		}
	}
	require.False(t, math.IsInf(first, 1), "the joiner's trace has no step")
	return time.UnixMicro(int64(first))
}
