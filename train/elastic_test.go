package train_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// The environment of a worker of an elastic job: elasticOutEnv set makes
// the test binary one, which writes its result to that file;
// elasticShardsEnv is its WithDeterministic's shards (0: off);
// elasticPerReplicaEnv its PerReplicaBatch (0: batches of 32).
const (
	elasticOutEnv        = "TRAIN_TEST_ELASTIC_OUT"
	elasticShardsEnv     = "TRAIN_TEST_ELASTIC_SHARDS"
	elasticPerReplicaEnv = "TRAIN_TEST_ELASTIC_PER_REPLICA"
	elasticDiLoCoEnv     = "TRAIN_TEST_ELASTIC_DILOCO" // H: DiLoCo, synchronising every H steps
	elasticHoldEnv       = "TRAIN_TEST_ELASTIC_HOLD"   // a file: while it holds a step count N, the worker waits after its steps from N on
)

// elasticWorkerMain is a worker of an elastic job, as a user writes one:
// distribute.Run calls Fit on every membership, and the worker prints
// each step it completes. A worker that finishes writes its model and
// History; one that left or was not needed writes nothing.
func elasticWorkerMain() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shards, _ := strconv.Atoi(os.Getenv(elasticShardsEnv))
	perReplica, _ := strconv.Atoi(os.Getenv(elasticPerReplicaEnv))
	cfg := distribute.Config{Strategy: "elastic", Devices: 1, Deterministic: shards, CollectiveTimeout: 20 * time.Second}
	if h, err := strconv.Atoi(os.Getenv(elasticDiLoCoEnv)); err == nil {
		cfg.LocalSGD = &multiworker.LocalSGD{Steps: h, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	}
	var res *jobResult
	err := distribute.Run(ctx, cfg, func(ctx context.Context, s distribute.Strategy) error {
		r, err := fitMLP(ctx, s, perReplica, stepPrinter{})
		if err == nil {
			res = &r
		}
		return err
	})
	if err != nil || res == nil {
		return err
	}
	out, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv(elasticOutEnv), out, 0o644)
}

// fitMLP trains the process tests' MLP on their data under s; with
// perReplica > 0, on their examples with PerReplicaBatch(perReplica), at
// an Adjustable rate, counting each epoch's labels (labelCounts).
func fitMLP(ctx context.Context, s train.Strategy, perReplica int, cbs ...train.Callback) (jobResult, error) {
	ss, ok := s.(strategy.Strategy)
	if !ok {
		return jobResult{}, fmt.Errorf("strategy %T is not synchronous", s)
	}
	var lr optimizer.Schedule = optimizer.Constant(0.05)
	var ms []train.Metric
	data := processData
	opts := []train.FitOption{train.Epochs(backupEpochs), train.WithCallbacks(cbs...)}
	if perReplica > 0 {
		lr, ms, data = optimizer.NewAdjustable(0.05), labelCounts(), processExamples
		opts = append(opts, train.PerReplicaBatch(perReplica))
	}
	tr, err := compileMLP(s, lr, ms...)
	if err != nil {
		return jobResult{}, err
	}
	ds, err := data()
	if err != nil {
		return jobResult{}, err
	}
	var res jobResult
	if res.History, err = tr.Fit(ctx, ds, opts...); err != nil {
		return res, err
	}
	if perReplica > 0 {
		if res.LearningRate, err = tr.LearningRate(ctx); err != nil {
			return res, err
		}
	}
	res.Vals, err = strategy.ReadVariables(ctx, ss, floatVars(ss))
	return res, err
}

// stepPrinter prints "step N" after every step, N the steps Fit has
// trained, and slows the steps so that a kill lands inside the run. While
// the file elasticHoldEnv names holds a count no more than N, it waits
// (up to a minute): the test holds the job so that a replacement joins
// before it ends.
type stepPrinter struct{ train.BaseCallback }

func (stepPrinter) OnBatchEnd(ctx context.Context, r *train.Run, _ int, _ train.Logs) error {
	fmt.Println("step", r.Steps())
	time.Sleep(20 * time.Millisecond)
	held := func() bool {
		b, err := os.ReadFile(os.Getenv(elasticHoldEnv))
		n, perr := strconv.ParseInt(string(b), 10, 64)
		return err == nil && perr == nil && n <= r.Steps()
	}
	for start := time.Now(); held() && time.Since(start) < time.Minute && ctx.Err() == nil; {
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// elasticWorker is a worker process of an elastic job.
type elasticWorker struct {
	name, out string
	cmd       *exec.Cmd
	steps     atomic.Int64 // the most it printed
	exited    chan struct{}
	err       error
}

// startElasticWorker starts a worker named name of job, writing its
// result into the job's directory, with env added to its environment.
func startElasticWorker(t *testing.T, job *fitJob, name string, shards int, env ...string) *elasticWorker {
	w := &elasticWorker{name: name, out: filepath.Join(job.dir, fmt.Sprintf("%s-%d.json", strings.ReplaceAll(name, ":", "-"), time.Now().UnixNano())), exited: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run", "^$")
	w.cmd.Env = append(os.Environ(), elasticOutEnv+"="+w.out, elasticShardsEnv+"="+strconv.Itoa(shards), elasticHoldEnv+"="+job.hold(),
		elastic.EnvRendezvous+"="+job.addr, elastic.EnvJob+"=fit-test", elastic.EnvName+"="+name)
	w.cmd.Env = append(w.cmd.Env, env...)
	w.cmd.Stderr = os.Stderr
	stdout, err := w.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	t.Cleanup(func() { _ = w.cmd.Process.Kill(); <-w.exited })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if n, ok := strings.CutPrefix(sc.Text(), "step "); ok {
				if k, err := strconv.ParseInt(n, 10, 64); err == nil && k > w.steps.Load() {
					w.steps.Store(k)
				}
			}
		}
		w.err = w.cmd.Wait()
		close(w.exited)
	}()
	return w
}

// result waits for w to exit successfully and reads what it wrote.
func (w *elasticWorker) result(t *testing.T) jobResult {
	t.Helper()
	select {
	case <-w.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not exit", w.name)
	}
	require.NoError(t, w.err, w.name)
	b, err := os.ReadFile(w.out)
	require.NoError(t, err, w.name)
	var r jobResult
	require.NoError(t, json.Unmarshal(b, &r), w.name)
	return r
}

// Fit on an elastic job whose worker is SIGKILLed at a random step, and
// replaced, goes on in the survivor's process from the last step: every
// finisher ends with the model and the History (every epoch's loss and
// accuracy) of one device's Fit over the same batches, to 1e-5, and bit
// for bit with WithDeterministic.
func TestElasticFitSurvivesAKill(t *testing.T) {
	for _, shards := range []int{0, 4} {
		t.Run(fmt.Sprintf("deterministic=%d", shards), func(t *testing.T) {
			s, err := onedevice.New(onedevice.WithDeterministic(shards))
			require.NoError(t, err)
			want, err := fitMLP(context.Background(), s, 0)
			require.NoError(t, err)
			require.NoError(t, s.Close())

			job := startFitJob(t, elastic.WithMembers(1, 2))
			ws := []*elasticWorker{startElasticWorker(t, job, "worker:0", shards), startElasticWorker(t, job, "worker:1", shards)}
			victim, at := rand.IntN(2), int64(5+rand.IntN(backupEpochs*10-15))
			require.Eventually(t, func() bool { return ws[victim].steps.Load() >= at }, 2*time.Minute, time.Millisecond)
			killed := job.kill(t, ws[victim], 1)
			finishers := []*elasticWorker{ws[1-victim], job.replace(t, ws[victim].name, shards)}
			t.Logf("killed %s after step %d", ws[victim].name, killed)
			for _, w := range finishers {
				got := w.result(t)
				t.Logf("%s: steps %d", w.name, w.steps.Load())
				diff, name, i := strategy.MaxDiff(want.Vals, got.Vals)
				if shards > 0 {
					assert.Zero(t, diff, "%s, %s killed at step %d: %s[%d]", w.name, ws[victim].name, at, name, i)
				} else {
					assert.Less(t, diff, 1e-5, "%s, %s killed at step %d: %s[%d]", w.name, ws[victim].name, at, name, i)
				}
				assert.Equal(t, want.History.Epochs, got.History.Epochs, w.name)
				for _, key := range []string{"loss", "accuracy"} {
					assert.InDeltaSlice(t, want.History.Values[key], got.History.Values[key], 1e-5, "%s: %s", w.name, key)
				}
			}
		})
	}
}

// fitJob is an elastic job whose rendezvous the test serves.
type fitJob struct {
	addr, dir string
	logs      *observer.ObservedLogs // the rendezvous's
}

// startFitJob serves a rendezvous of opts until the test ends.
func startFitJob(t *testing.T, opts ...elastic.Option) *fitJob {
	core, logs := observer.New(zap.InfoLevel)
	opts = append([]elastic.Option{elastic.WithJob("fit-test"), elastic.WithLogger(zap.New(core))}, opts...)
	srv, err := elastic.Listen("127.0.0.1:0", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(served) }()
	t.Cleanup(func() { cancel(); <-served })
	return &fitJob{addr: srv.Addr(), dir: t.TempDir(), logs: logs}
}

// hold is the file that holds the job's workers (elasticHoldEnv).
func (j *fitJob) hold() string { return filepath.Join(j.dir, "hold") }

// kill SIGKILLs w and has the job's other workers wait after their
// steps from after more steps than w completed; it returns w's steps.
func (j *fitJob) kill(t *testing.T, w *elasticWorker, after int64) int64 {
	require.NoError(t, w.cmd.Process.Kill())
	killed := w.steps.Load()
	require.NoError(t, os.WriteFile(j.hold(), []byte(strconv.FormatInt(killed+after, 10)), 0o644))
	return killed
}

// replace starts a worker named name, with env, once its predecessor
// was killed, and releases the job's workers once the rendezvous
// admitted it: the job cannot end before the replacement joins.
func (j *fitJob) replace(t *testing.T, name string, shards int, env ...string) *elasticWorker {
	admitted := func() int {
		return j.logs.FilterMessage("admitted a worker").FilterField(zap.String("worker", name)).Len()
	}
	before := admitted()
	w := startElasticWorker(t, j, name, shards, env...)
	require.Eventually(t, func() bool { return admitted() > before }, time.Minute, time.Millisecond, "%s is admitted", name)
	require.NoError(t, os.Remove(j.hold()))
	return w
}

// Fit with PerReplicaBatch(8) on an elastic job whose worker is SIGKILLed
// at a random step, and replaced, trains every example of every epoch once
// (each epoch counts every label of the data as often as the data has
// it), ends at 0.05 times the last membership's replicas, and ends with
// the model of a replay of its membership log, bit for bit.
func TestElasticFitPerReplicaBatch(t *testing.T) {
	env := elasticPerReplicaEnv + "=8"
	var log syncbuf.Buffer
	finishers, what := killOneOfTwo(t, &log, 5+rand.IntN(25), env)
	var run jobResult
	for i, w := range finishers {
		got := w.result(t)
		if i == 0 {
			run = got
		}
		diff, name, j := strategy.MaxDiff(run.Vals, got.Vals)
		assert.Zero(t, diff, "%s: %s and %s: %s[%d]", what, finishers[0].name, w.name, name, j)
	}
	entries, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	t.Logf("%s: memberships %+v", what, entries)
	require.True(t, slices.ContainsFunc(entries[:len(entries)-1], func(e elastic.LogEntry) bool { return len(e.Members) == 1 }),
		"%s: a membership of one worker trained", what)

	require.Equal(t, []int{0, 1, 2, 3}, run.History.Epochs, what)
	for c, n := range processLabelCounts(t) {
		key := labelCount(c).Name()
		assert.Equal(t, []float64{n, n, n, n}, run.History.Values[key], "%s: %s in every epoch", what, key)
	}
	last := len(entries[len(entries)-1].Members)
	assert.InDelta(t, 0.05*float64(last), run.LearningRate, 1e-7, "%s: the rate of %d replicas", what, last)
	replayEndsWith(t, entries, finishers, run, what, env)
}

// killOneOfTwo starts a job of two workers (of one at least) with env,
// writing its membership log to log, SIGKILLs one of them, at random,
// once it has completed at least at steps, waits for the survivor to
// train 3 steps alone, and starts a replacement. It returns the survivor
// and the replacement, and what befell the victim.
func killOneOfTwo(t *testing.T, log io.Writer, at int, env string) ([]*elasticWorker, string) {
	job := startFitJob(t, elastic.WithMembers(1, 2), elastic.WithLog(log))
	ws := []*elasticWorker{startElasticWorker(t, job, "worker:0", 0, env), startElasticWorker(t, job, "worker:1", 0, env)}
	victim := rand.IntN(2)
	require.Eventually(t, func() bool { return ws[victim].steps.Load() >= int64(at) }, 2*time.Minute, time.Millisecond)
	killed := job.kill(t, ws[victim], 3)
	require.Eventually(t, func() bool { return ws[1-victim].steps.Load() >= killed+3 }, 2*time.Minute, time.Millisecond, "the survivor trains alone")
	return []*elasticWorker{ws[1-victim], job.replace(t, ws[victim].name, 0, env)}, fmt.Sprintf("%s killed after step %d", ws[victim].name, killed)
}

// replayEndsWith replays the job of entries with the workers finishers
// (a survivor, then a replacement) and env, and checks that the survivor
// ends with run's variables, bit for bit.
func replayEndsWith(t *testing.T, entries []elastic.LogEntry, finishers []*elasticWorker, run jobResult, what, env string) {
	job := startFitJob(t, elastic.WithReplay(entries))
	survivor := startElasticWorker(t, job, finishers[0].name, 0, env)
	startElasticWorker(t, job, finishers[1].name, 0, env)
	diff, name, j := strategy.MaxDiff(run.Vals, survivor.result(t).Vals)
	assert.Zero(t, diff, "%s: the replay: %s[%d]", what, name, j)
}

// Fit under DiLoCo (a synchronisation every 5 steps) on an elastic job
// whose worker is SIGKILLed at a random step, and replaced: the survivor
// goes on from the last step both completed, trains alone, the
// replacement joins at a synchronisation, both end with one model (their optimizer slots are
// their own), and a replay of the membership log ends with the same bits.
func TestElasticFitDiLoCo(t *testing.T) {
	env := elasticDiLoCoEnv + "=5"
	var log syncbuf.Buffer
	finishers, what := killOneOfTwo(t, &log, 3+rand.IntN(20), env)
	run := finishers[0].result(t)
	diff, name, j := strategy.MaxDiff(withoutSlots(run.Vals), withoutSlots(finishers[1].result(t).Vals))
	assert.Zero(t, diff, "%s: after the last synchronisation: %s[%d]", what, name, j)
	require.Equal(t, []int{0, 1, 2, 3}, run.History.Epochs, what)
	entries, err := elastic.ReadLog(strings.NewReader(log.String()))
	require.NoError(t, err)
	t.Logf("%s: memberships %+v", what, entries)
	replayEndsWith(t, entries, finishers, run, what, env)
}

// withoutSlots returns the variables of vs but the optimizer's slots.
func withoutSlots(vs []strategy.VariableValue) []strategy.VariableValue {
	var out []strategy.VariableValue
	for _, v := range vs {
		if !strings.Contains(v.Name, "/KerasMomentum/") {
			out = append(out, v)
		}
	}
	return out
}
