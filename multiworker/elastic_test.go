package multiworker_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// The environment of an elastic worker process (this test binary again).
const (
	elasticNameEnv   = "MULTIWORKER_TEST_ELASTIC_NAME"
	elasticRdzvEnv   = "MULTIWORKER_TEST_ELASTIC_RENDEZVOUS"
	elasticStepsEnv  = "MULTIWORKER_TEST_ELASTIC_STEPS"
	elasticShardsEnv = "MULTIWORKER_TEST_ELASTIC_SHARDS" // WithDeterministic's, if set
	elasticOtherEnv  = "MULTIWORKER_TEST_ELASTIC_OTHER"  // set: build another model
	elasticDiLoCoEnv = "MULTIWORKER_TEST_ELASTIC_DILOCO" // H: train with DiLoCo, synchronising every H steps after 20 synchronous ones
)

// elasticGlobal is the global batch of the elastic tests, divided among
// 2 or 3 workers; elasticLR their learning rate.
const (
	elasticGlobal = 12
	elasticLR     = 0.05
)

// elasticLine is what an elastic worker prints, one JSON object a line.
type elasticLine struct {
	Event   string    `json:"event"` // "membership", "step", "done", "left" or "error"
	Step    int64     `json:"step"`  // steps completed
	Workers int       `json:"workers"`
	Nanos   int64     `json:"ns"`
	Weights []float32 `json:"weights,omitempty"`
	Err     string    `json:"err,omitempty"`
}

func printLine(l elasticLine) {
	l.Nanos = time.Now().UnixNano()
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
}

// runElasticWorker plays an elastic worker when elasticNameEnv says so:
// it trains testmodel.Linear, each step on its share of the global batch
// of that step, through every membership, and prints its steps and its
// final weights. SIGTERM makes it leave at the next step boundary.
func runElasticWorker() (int, bool) {
	name, ok := os.LookupEnv(elasticNameEnv)
	if !ok {
		return 0, false
	}
	steps, _ := strconv.ParseInt(os.Getenv(elasticStepsEnv), 10, 64)
	opts := []multiworker.Option{multiworker.WithCollectiveTimeout(20 * time.Second)}
	if v, err := strconv.Atoi(os.Getenv(elasticShardsEnv)); err == nil {
		opts = append(opts, multiworker.WithDeterministic(v))
	}
	if h, err := strconv.Atoi(os.Getenv(elasticDiLoCoEnv)); err == nil {
		opts = append(opts, multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: h, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true, WarmupSteps: 20}))
	}
	ctx := context.Background()
	m, err := elastic.Join(ctx, os.Getenv(elasticRdzvEnv), elastic.Hello{Job: "elastic-test", Name: name})
	if err != nil {
		printLine(elasticLine{Event: "error", Err: err.Error()})
		return 1, true
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { <-term; m.LeaveSoon() }()
	var w []float32
	err = multiworker.RunElastic(ctx, m, "127.0.0.1", func(ctx context.Context, s *multiworker.Strategy) error {
		l, err := testmodel.NewLinear(s, elasticLR)
		if err != nil {
			return err
		}
		if os.Getenv(elasticOtherEnv) != "" {
			if err := s.Scope(func(sc strategy.Scope) error {
				_, err := sc.Variable("other", tf.Float, []int64{2}, strategy.Zeros())
				return err
			}); err != nil {
				return err
			}
		}
		start, err := s.Resume(ctx)
		if err != nil {
			return err
		}
		// The progress kept with the state is the one set at its step.
		if p := string(s.Progress()); start > 0 && p != strconv.FormatInt(start, 10) {
			return fmt.Errorf("resumed at step %d with the progress of step %q", start, p)
		}
		n, rank := s.NumWorkers(), s.WorkerID()
		printLine(elasticLine{Event: "membership", Step: start, Workers: n})
		for step := start; step < steps; step++ {
			per := elasticGlobal / n
			if _, err := l.Run(ctx, int(step)*elasticGlobal+rank*per, per); err != nil {
				return err
			}
			printLine(elasticLine{Event: "step", Step: step + 1, Workers: n})
			time.Sleep(20 * time.Millisecond) // a longer step, for the kills to land inside the run
			s.SetProgress([]byte(strconv.FormatInt(step+1, 10)))
			if err := s.StepDone(ctx); err != nil {
				return err
			}
		}
		w, err = l.Weights(ctx)
		return err
	}, opts...)
	switch {
	case err != nil:
		printLine(elasticLine{Event: "error", Err: err.Error()})
		return 1, true
	case w == nil:
		printLine(elasticLine{Event: "left"})
	default:
		printLine(elasticLine{Event: "done", Step: steps, Weights: w})
	}
	return 0, true
}

// elasticJob is a rendezvous and its worker processes.
type elasticJob struct {
	t      *testing.T
	srv    *elastic.Server
	steps  int
	shards int      // WithDeterministic's, 0 without
	env    []string // of every worker
	mu     sync.Mutex
	procs  []*elasticProc
}

type elasticProc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	lines   []elasticLine
	exited  chan struct{}
	err     error
}

func newElasticJob(t *testing.T, steps int, opts ...elastic.Option) *elasticJob {
	srv, err := elastic.Listen("127.0.0.1:0", append([]elastic.Option{elastic.WithJob("elastic-test")}, opts...)...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(served) }()
	j := &elasticJob{t: t, srv: srv, steps: steps}
	t.Cleanup(func() {
		for _, p := range j.procs {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		cancel()
		<-served
	})
	return j
}

func (j *elasticJob) start(name string, env ...string) *elasticProc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(append(os.Environ(), j.env...), env...), elasticNameEnv+"="+name, elasticRdzvEnv+"="+j.srv.Addr(), elasticStepsEnv+"="+strconv.Itoa(j.steps))
	if j.shards > 0 {
		cmd.Env = append(cmd.Env, elasticShardsEnv+"="+strconv.Itoa(j.shards))
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(j.t, err)
	p := &elasticProc{name: name, cmd: cmd, started: time.Now(), exited: make(chan struct{})}
	require.NoError(j.t, cmd.Start())
	j.procs = append(j.procs, p)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l elasticLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				j.mu.Lock()
				p.lines = append(p.lines, l)
				j.mu.Unlock()
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p
}

// completed is the most steps p has completed.
func (j *elasticJob) completed(p *elasticProc) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var n int64
	for _, l := range p.lines {
		if l.Event == "step" {
			n = max(n, l.Step)
		}
	}
	return n
}

// last returns p's last line once it has exited.
func (j *elasticJob) last(p *elasticProc) elasticLine {
	select {
	case <-p.exited:
	case <-time.After(3 * time.Minute):
		j.t.Fatalf("%s did not exit", p.name)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	require.NotEmpty(j.t, p.lines, "%s printed nothing", p.name)
	return p.lines[len(p.lines)-1]
}

// endWith checks that every process of ps finished with the weights want
// (to 1e-5).
func (j *elasticJob) endWith(want []float32, ps ...*elasticProc) {
	j.t.Helper()
	for _, p := range ps {
		last := j.last(p)
		require.Equal(j.t, "done", last.Event, "%s: %+v", p.name, last)
		require.NoError(j.t, p.err)
		assert.InDeltaSlice(j.t, want, last.Weights, 1e-5, "%s: the model differs from one device's", p.name)
	}
}

// linearOnOneDevice trains testmodel.Linear on one device on every global
// batch of steps: the model every elastic run must end with.
func linearOnOneDevice(t *testing.T, steps int, opts ...onedevice.Option) []float32 {
	return linearOnOneDeviceWith(t, linearSGD(), steps, opts...)
}

// linearOnOneDeviceWith is linearOnOneDevice minimised by opt.
func linearOnOneDeviceWith(t *testing.T, opt strategy.Optimizer, steps int, opts ...onedevice.Option) []float32 {
	s, err := onedevice.New(opts...)
	require.NoError(t, err)
	defer s.Close()
	l, err := testmodel.NewLinearWith(s, opt)
	require.NoError(t, err)
	ctx := context.Background()
	for step := range steps {
		_, err := l.Run(ctx, step*elasticGlobal, elasticGlobal)
		require.NoError(t, err)
	}
	w, err := l.Weights(ctx)
	require.NoError(t, err)
	return w
}

// TestElasticKillAndReplace kills one worker of three at a random step
// and starts a replacement: the two survivors go on in the same processes
// with the last step either completed, the replacement joins at a step
// boundary with their state, and every worker ends with the model of one
// device trained on every global batch once.
//
// Replayed from the membership log the job wrote — the same memberships,
// in the same order, over the same steps, with no kill — the job ends
// with the same bits.
func TestElasticKillAndReplace(t *testing.T) {
	const steps = 120
	want := linearOnOneDevice(t, steps)
	var log syncbuf.Buffer
	j := newElasticJob(t, steps, elastic.WithMembers(2, 3), elastic.WithLog(&log))
	got := killAndReplace(t, j, 3)
	for _, w := range got {
		assert.InDeltaSlice(t, want, w, 1e-5, "the model differs from one device's")
	}
	entries, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(entries), 3, "the first membership, the survivors', and the replacement's: %+v", entries)
	for _, e := range entries {
		t.Logf("membership %d from step %d: %v", e.Epoch, e.Step, e.Members)
	}
	replayed := replay(t, entries, steps)
	require.NotEmpty(t, replayed)
	for _, w := range replayed {
		assert.Equal(t, got[0], w, "the replay's model differs from the run's")
	}
}

// replay runs the job of entries again without failures, each worker it
// names from the start, checks that the replay forms the logged
// memberships at the logged steps, and returns the weights of the
// workers of the last membership; the others, standbys at the end, leave.
// Every worker runs with env.
func replay(t *testing.T, entries []elastic.LogEntry, steps int, env ...string) [][]float32 {
	var log syncbuf.Buffer
	j := newElasticJob(t, steps, elastic.WithReplay(entries), elastic.WithLog(&log))
	j.env = env
	var names []string
	for _, e := range entries {
		for _, n := range e.Members {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	procs := map[string]*elasticProc{}
	for _, n := range names {
		procs[n] = j.start(n)
	}
	last := entries[len(entries)-1].Members
	var weights [][]float32
	for _, n := range names {
		l := j.last(procs[n])
		require.NoError(t, procs[n].err, n)
		if !slices.Contains(last, n) {
			assert.Equal(t, "left", l.Event, "%s, a standby at the end: %+v", n, l)
			continue
		}
		require.Equal(t, "done", l.Event, "%s: %+v", n, l)
		weights = append(weights, l.Weights)
	}
	formed, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	var want, got []string
	for i, e := range entries {
		if i+1 == len(entries) || entries[i+1].Step > e.Step { // one that trained a step
			want = append(want, fmt.Sprint(e.Step, e.Members))
		}
	}
	for _, e := range formed {
		got = append(got, fmt.Sprint(e.Step, e.Members))
	}
	assert.Equal(t, want, got, "the replay's memberships")
	return weights
}

// TestElasticDeterministicKillAndReplace: with WithDeterministic, a job
// of two workers that loses one, goes on alone, and takes a replacement
// ends bit for bit with one device's model.
func TestElasticDeterministicKillAndReplace(t *testing.T) {
	const steps, shards = 120, 4
	want := linearOnOneDevice(t, steps, onedevice.WithDeterministic(shards))
	j := newElasticJob(t, steps, elastic.WithMembers(1, 2))
	j.shards = shards
	for _, w := range killAndReplace(t, j, 2) {
		assert.Equal(t, want, w, "the model differs from one device's")
	}
}

// TestElasticDiLoCoKillAndReplace: a DiLoCo job of three workers, which
// meet every 5 steps, loses one at a random step and takes a replacement:
// the survivors fail at the next synchronisation and go on from the last
// step they completed, the replacement joins at a synchronisation, and
// every worker ends with one model; replayed from the membership log, the
// job ends with the same bits.
func TestElasticDiLoCoKillAndReplace(t *testing.T) {
	const steps = 120
	var log syncbuf.Buffer
	j := newElasticJob(t, steps, elastic.WithMembers(2, 3), elastic.WithLog(&log))
	j.env = []string{elasticDiLoCoEnv + "=5"}
	got := killAndReplace(t, j, 3)
	for _, w := range got[1:] {
		assert.Equal(t, got[0], w, "after the last synchronisation every worker holds one model")
	}
	assert.NotEqual(t, linearOnOneDevice(t, steps), got[0], "DiLoCo trains another model than synchronous SGD")
	entries, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	for _, e := range entries {
		t.Logf("membership %d from step %d: %v", e.Epoch, e.Step, e.Members)
	}
	replayed := replay(t, entries, steps, j.env...)
	require.NotEmpty(t, replayed)
	for _, w := range replayed {
		assert.Equal(t, got[0], w, "the replay's model differs from the run's")
	}
}

// killAndReplace starts n workers, kills one at a random step, starts a
// replacement, and returns the weights each finisher ends with.
func killAndReplace(t *testing.T, j *elasticJob, n int) [][]float32 {
	var ps []*elasticProc
	for i := range n {
		ps = append(ps, j.start("worker:"+strconv.Itoa(i)))
	}
	victim, at := rand.IntN(n), int64(10+rand.IntN(30))
	require.Eventually(t, func() bool { return j.completed(ps[0]) >= at }, 2*time.Minute, time.Millisecond)
	killed := time.Now()
	require.NoError(t, ps[victim].cmd.Process.Kill())
	repl := j.start(ps[victim].name)
	var finishers []*elasticProc
	for i, p := range ps {
		if i != victim {
			finishers = append(finishers, p)
		}
	}
	finishers = append(finishers, repl)
	var weights [][]float32
	for _, p := range finishers {
		last := j.last(p)
		require.Equal(t, "done", last.Event, "%s: %+v", p.name, last)
		require.NoError(t, p.err)
		weights = append(weights, last.Weights)
	}
	t.Logf("killed %s at step %d; the first step of a new group %v later; the replacement's first step %v after its start",
		ps[victim].name, at, j.healed(finishers[0], killed), j.healed(repl, repl.started))
	return weights
}

// healed is how long after t p first completed a step of a group formed
// after t.
func (j *elasticJob) healed(p *elasticProc, t time.Time) time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	formed := false
	for _, l := range p.lines {
		formed = formed || l.Event == "membership" && l.Nanos > t.UnixNano()
		if formed && l.Event == "step" {
			return time.Duration(l.Nanos - t.UnixNano()).Round(time.Millisecond)
		}
	}
	return 0
}

// twoWorkersAt starts a job of steps steps on two workers, of three at
// most, and returns once the first has completed step at, with the model
// the job must end with.
func twoWorkersAt(t *testing.T, steps int, at int64) (j *elasticJob, want []float32, a, b *elasticProc) {
	want = linearOnOneDevice(t, steps)
	j = newElasticJob(t, steps, elastic.WithMembers(2, 3), elastic.WithSettle(0))
	a, b = j.start("worker:0"), j.start("worker:1")
	require.Eventually(t, func() bool { return j.completed(a) >= at }, 2*time.Minute, time.Millisecond)
	return j, want, a, b
}

// TestElasticScaleUpAndLeave grows a job of two workers to three, then one
// leaves on SIGTERM at a step boundary: the leaver exits cleanly without
// finishing, and the others end with one device's model.
func TestElasticScaleUpAndLeave(t *testing.T) {
	j, want, a, b := twoWorkersAt(t, 120, 20)
	c := j.start("worker:2")
	require.Eventually(t, func() bool { return j.completed(c) > 0 }, 2*time.Minute, time.Millisecond)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, "left", j.last(a).Event)
	require.NoError(t, a.err)
	j.endWith(want, b, c)
	j.mu.Lock()
	defer j.mu.Unlock()
	var sizes []int
	for _, l := range b.lines {
		if l.Event == "membership" {
			sizes = append(sizes, l.Workers)
		}
	}
	assert.Equal(t, []int{2, 3, 2}, sizes, "worker:1's memberships")
}

// TestElasticJoinerWithAnotherModelIsTurnedAway: a joiner that builds
// another model leaves with ErrModelMismatch, and the job goes on without
// it to one device's model.
func TestElasticJoinerWithAnotherModelIsTurnedAway(t *testing.T) {
	j, want, a, b := twoWorkersAt(t, 80, 10)
	odd := j.start("worker:2", elasticOtherEnv+"=1")
	last := j.last(odd)
	assert.Equal(t, "error", last.Event)
	assert.Contains(t, last.Err, "this worker's model differs from the job's: its variables' names, dtypes or shapes differ from those of worker 0")
	j.endWith(want, a, b)
}

// TestElasticDeterministicJoinerThatRoundsOtherwiseIsTurnedAway: under
// WithDeterministic, a joiner with another intra-op thread count than the
// worker holding the job's state leaves with ErrArithmeticMismatch, naming
// both counts, and the job goes on without it to one device's model, bit
// for bit.
func TestElasticDeterministicJoinerThatRoundsOtherwiseIsTurnedAway(t *testing.T) {
	const steps, shards = 60, 4
	want := linearOnOneDevice(t, steps, onedevice.WithDeterministic(shards))
	j := newElasticJob(t, steps, elastic.WithMembers(1, 2), elastic.WithSettle(0))
	j.shards, j.env = shards, []string{"TF_NUM_INTRAOP_THREADS=2"}
	a := j.start("worker:0")
	require.Eventually(t, func() bool { return j.completed(a) >= 10 }, 2*time.Minute, time.Millisecond)
	odd := j.start("worker:1", "TF_NUM_INTRAOP_THREADS=1")
	last := j.last(odd)
	assert.Equal(t, "error", last.Event)
	assert.Contains(t, last.Err, multiworker.ErrArithmeticMismatch.Error())
	assert.Contains(t, last.Err, "intra-op threads: task worker:1 has 1 and task worker:0 (which holds the job's state) has 2")
	last = j.last(a)
	require.Equal(t, "done", last.Event, "%+v", last)
	assert.Equal(t, want, last.Weights, "the model differs from one device's")
}

func resolver(t *testing.T) cluster.Resolver {
	r, err := cluster.NewSimpleResolver(loopbackSpec(t, 2), cluster.Task{Type: cluster.Worker})
	require.NoError(t, err)
	return r
}

// TestElasticBadInput: the options an elastic job cannot honour, and the
// elastic calls on a strategy that is not elastic, are errors naming them.
func TestElasticBadInput(t *testing.T) {
	srv, err := elastic.Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Serve(ctx) }()
	for _, c := range []struct {
		opt  multiworker.Option
		want string
	}{
		{multiworker.WithCommunication(multiworker.Ring), "RunElastic: WithCommunication(ring): an elastic job runs on tfdist's engine"},
		{multiworker.RequireTLS(), "TLS is required (RequireTLS or TFDIST_REQUIRE_TLS) but no certificate is configured"},
		{multiworker.WithResolver(resolver(t)), "RunElastic: WithResolver: an elastic job's membership comes from its rendezvous"},
		{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Overlap: 1}), "RunElastic: WithLocalSGD with Overlap 1: an elastic job synchronises between two steps"},
	} {
		m, err := elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "w"})
		require.NoError(t, err)
		err = multiworker.RunElastic(ctx, m, "127.0.0.1", func(context.Context, *multiworker.Strategy) error {
			t.Error("train ran")
			return nil
		}, c.opt)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.want)
	}
	s, err := multiworker.New(ctx)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Resume(ctx)
	assert.ErrorContains(t, err, "Resume: the strategy is not elastic (RunElastic makes one)")
	assert.ErrorContains(t, s.StepDone(ctx), "StepDone: the strategy is not elastic")
}

// TestElasticStoppedWorkerIsDroppedAtTheHeartbeatTimeout: a worker that
// stops (SIGSTOP: a wedged process, a host cut off) is dropped by the
// rendezvous when its heartbeats stop, and the others abort their step
// then rather than at the collective timeout (20 s here), go on without
// it, and end with one device's model.
func TestElasticStoppedWorkerIsDroppedAtTheHeartbeatTimeout(t *testing.T) {
	const steps = 120
	want := linearOnOneDevice(t, steps)
	j := newElasticJob(t, steps, elastic.WithMembers(2, 3), elastic.WithHeartbeatTimeout(2*time.Second))
	ps := []*elasticProc{j.start("worker:0"), j.start("worker:1"), j.start("worker:2")}
	require.Eventually(t, func() bool { return j.completed(ps[0]) >= 20 }, 2*time.Minute, time.Millisecond)
	stopped := time.Now()
	require.NoError(t, ps[2].cmd.Process.Signal(syscall.SIGSTOP))
	j.endWith(want, ps[0], ps[1])
	healed := j.healed(ps[0], stopped)
	assert.Less(t, healed, 10*time.Second, "the survivors waited for the collective timeout")
	t.Logf("stopped worker:2; the first step of a new group %v later (heartbeat timeout 2s)", healed)
}

// TestElasticMembershipsAreObserved: each membership of an elastic job is
// counted in the worker's metrics (tfdist_memberships_total,
// tfdist_workers) and is a span of its timeline naming its epoch, workers
// and step, for two workers in one process of which one leaves.
func TestElasticMembershipsAreObserved(t *testing.T) {
	srv, err := elastic.Listen("127.0.0.1:0", elastic.WithMembers(1, 2), elastic.WithSettle(time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	metrics, rec := monitoring.New("worker:0"), timeline.New(1<<10)
	errs := make(chan error, 2)
	for i := range 2 {
		m, err := elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "worker:" + strconv.Itoa(i)})
		require.NoError(t, err)
		opts := []multiworker.Option{}
		if i == 0 {
			opts = append(opts, multiworker.WithMonitoring(metrics), multiworker.WithTimeline(rec))
		}
		leaveAt := int64(-1)
		if i == 1 {
			leaveAt = 10
		}
		go func() { errs <- trainLinear(ctx, m, 40, leaveAt, nil, opts...) }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.NoError(t, <-served)
	assert.Equal(t, 2.0, value(t, metrics.Memberships))
	assert.Equal(t, 1.0, value(t, metrics.Workers))
	spans, _ := rec.Spans()
	var formed []map[string]any
	for _, s := range spans {
		if s.Phase == timeline.Membership {
			formed = append(formed, s.Args.(map[string]any))
		}
	}
	require.Len(t, formed, 2)
	assert.Equal(t, uint32(1), formed[0]["epoch"])
	assert.Equal(t, 2, formed[0]["workers"])
	assert.Equal(t, 1, formed[1]["workers"])
	assert.Equal(t, int64(11), formed[1]["step"], "the second membership goes on after the leaver's last step")
}

// trainLinear trains testmodel.Linear for steps steps as m, an elastic
// job's worker, which leaves after step leaveAt (never if negative), and
// keeps the weights it ends with in weights, if not nil.
func trainLinear(ctx context.Context, m *elastic.Member, steps int64, leaveAt int64, weights *[]float32, opts ...multiworker.Option) error {
	return multiworker.RunElastic(ctx, m, "127.0.0.1", func(ctx context.Context, s *multiworker.Strategy) error {
		l, err := testmodel.NewLinear(s, elasticLR)
		if err != nil {
			return err
		}
		start, err := s.Resume(ctx)
		if err != nil {
			return err
		}
		for step := start; step < steps; step++ {
			per := elasticGlobal / s.NumWorkers()
			if _, err := l.Run(ctx, int(step)*elasticGlobal+s.WorkerID()*per, per); err != nil {
				return err
			}
			if step == leaveAt {
				m.LeaveSoon()
			}
			if err := s.StepDone(ctx); err != nil {
				return err
			}
		}
		if weights != nil {
			*weights, err = l.Weights(ctx)
		}
		return err
	}, opts...)
}

// TestElasticOverTLS: an elastic job whose rendezvous and groups run
// mutual TLS, each worker with a certificate naming it (the files the
// environment names are read as New reads them). Two workers train, one
// leaves, and the other ends with one device's model. A worker that
// joined under another name than its certificate's is refused by
// RunElastic, naming both.
func TestElasticOverTLS(t *testing.T) {
	const steps = 40
	want := linearOnOneDevice(t, steps)
	files, err := mtls.WriteTasks(t.TempDir(), "j", []cluster.Task{mtls.RendezvousTask,
		{Type: cluster.Worker, Index: 0}, {Type: cluster.Worker, Index: 1}}, time.Hour)
	require.NoError(t, err)
	config := func(i int) *tls.Config {
		cfg, err := mtls.LoadConfig(files[cluster.Task{Type: cluster.Worker, Index: i}])
		require.NoError(t, err)
		return cfg
	}
	rdzv, err := mtls.LoadConfig(files[mtls.RendezvousTask])
	require.NoError(t, err)
	srv, err := elastic.Listen("127.0.0.1:0", elastic.WithMembers(1, 2), elastic.WithSettle(time.Hour), elastic.WithTLS(rdzv))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	for _, kv := range files[cluster.Task{Type: cluster.Worker, Index: 1}].Env(true) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	errs := make(chan error, 2)
	var weights []float32
	for i := range 2 {
		cfg := config(i)
		m, err := elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "j", Name: "worker:" + strconv.Itoa(i)}, elastic.WithClientTLS(cfg))
		require.NoError(t, err)
		if i == 0 {
			go func() {
				errs <- trainLinear(ctx, m, steps, -1, &weights, multiworker.WithTLS(cfg), multiworker.RequireTLS())
			}()
		} else { // from the environment
			go func() { errs <- trainLinear(ctx, m, steps, 10, nil) }()
		}
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.NoError(t, <-served)
	assert.InDeltaSlice(t, want, weights, 1e-5, "the model differs from one device's")

	plain, err := elastic.Listen("127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = plain.Serve(ctx) }()
	m, err := elastic.Join(ctx, plain.Addr(), elastic.Hello{Job: "j", Name: "worker:0"})
	require.NoError(t, err)
	err = trainLinear(ctx, m, steps, -1, nil, multiworker.WithTLS(config(1)))
	assert.ErrorContains(t, err, `multiworker: RunElastic: this worker joined the job as "worker:0" but its certificate names tfdist://j/worker/1`)
}

// value reads a counter's or gauge's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	var d dto.Metric
	require.NoError(t, m.Write(&d))
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
