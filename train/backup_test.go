package train_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// The environment of a worker process: workerEnv set makes the test
// binary one; it backs up into backupEnv's directory, kills itself with
// SIGKILL after killEnv's step, if set, and the chief writes its model to
// outEnv's file.
const (
	workerEnv = "TRAIN_TEST_WORKER"
	backupEnv = "TRAIN_TEST_BACKUP"
	killEnv   = "TRAIN_TEST_KILL_AT"
	outEnv    = "TRAIN_TEST_OUT"
	dilocoEnv = "TRAIN_TEST_DILOCO" // H: train with DiLoCo, synchronising every H steps
)

// kills is the number of kills of TestBackupAndRestoreSurvivesKills.
var kills = flag.Int("backup-kills", 3, "kills of the BackupAndRestore process test (the issue's check is 10)")

// backupEpochs are the epochs of the process tests (see processData).
const backupEpochs = 4

// workerMain is a worker of the process tests: Fit with BackupAndRestore
// every 3 steps, under TF_CONFIG's multiworker cluster.
func workerMain() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []multiworker.Option{multiworker.WithLogicalCPUs(1),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(20 * time.Second)}
	if h, err := strconv.Atoi(os.Getenv(dilocoEnv)); err == nil {
		opts = append(opts, multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: h, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}))
	}
	s, err := multiworker.New(ctx, opts...)
	if err != nil {
		return err
	}
	defer s.Close()
	tr, err := compileMLP(s, optimizer.Constant(0.05))
	if err != nil {
		return err
	}
	ds, err := processData()
	if err != nil {
		return err
	}
	cbs := []train.Callback{&train.BackupAndRestore{Dir: os.Getenv(backupEnv), SaveFreq: 3}}
	if at, err := strconv.Atoi(os.Getenv(killEnv)); err == nil {
		cbs = append(cbs, killer{at: int64(at)})
	}
	h, err := tr.Fit(ctx, ds, train.Epochs(backupEpochs), train.WithCallbacks(cbs...))
	if err != nil || !s.IsChief() {
		return err
	}
	vals, err := strategy.ReadVariables(ctx, s, floatVars(s))
	if err != nil {
		return err
	}
	out, err := json.Marshal(struct {
		Vals    []strategy.VariableValue
		History *train.History
	}{vals, h})
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv(outEnv), out, 0o644)
}

// compileMLP compiles an MLP of the digits in s's scope, as the process
// tests train it: SGD with momentum 0.9 at lr, reporting accuracy and ms.
func compileMLP(s train.Strategy, lr optimizer.Schedule, ms ...train.Metric) (*train.Trainer, error) {
	var m *nn.Model
	err := s.Scope(func(sc strategy.Scope) (err error) {
		in := nn.Input(64)
		h := nn.Dense{Units: 32, Activation: nn.ReLU}.Call(in)
		m, err = nn.NewModel(sc, "mlp", []*nn.Tensor{in}, []*nn.Tensor{nn.Dense{Units: 10}.Call(h)}, nn.WithSeed(5))
		return err
	})
	if err != nil {
		return nil, err
	}
	return train.Compile(s, m, train.SparseCategoricalCrossentropy{FromLogits: true},
		optimizer.NewKerasMomentum(lr, 0.9, false), train.WithMetrics(append([]train.Metric{train.SparseCategoricalAccuracy{}}, ms...)...))
}

// processExamples is the examples of the process tests: 300 digits,
// reshuffled each epoch.
func processExamples() (dataset.Dataset, error) {
	d, err := digits.Load()
	if err != nil {
		return nil, err
	}
	ds, err := dataset.FromSlices(map[string]any{"x": d.X[:300], "y": d.Y[:300]})
	if err != nil {
		return nil, err
	}
	return dataset.Shuffle(ds, 300, 11), nil
}

// processData is the training data of the process tests: their examples
// in global batches of 32, a partial batch at each epoch's end: 10 steps
// an epoch.
func processData() (dataset.Dataset, error) {
	ds, err := processExamples()
	if err != nil {
		return nil, err
	}
	return dataset.Batched(ds, 32, false), nil
}

// killer kills its process with SIGKILL after step at.
type killer struct {
	train.BaseCallback
	at int64
}

func (k killer) OnBatchEnd(_ context.Context, r *train.Run, _ int, _ train.Logs) error {
	if r.Steps() == k.at {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return nil
}

func floatVars(s strategy.Strategy) []strategy.Variable {
	var vs []strategy.Variable
	for _, v := range s.Variables() {
		if v.DType() == tf.Float {
			vs = append(vs, v)
		}
	}
	return vs
}

// launch runs the two workers of a job as processes of this test binary
// until both exit, and returns each one's error.
func launch(t *testing.T, dir string, env ...string) []error {
	t.Helper()
	ports, err := freeport.Loopback(2)
	require.NoError(t, err)
	cl := fmt.Sprintf(`{"worker": ["127.0.0.1:%d", "127.0.0.1:%d"]}`, ports[0], ports[1])
	cmds := make([]*exec.Cmd, 2)
	logs := make([]*syncbuf.Buffer, 2)
	for w := range cmds {
		cmds[w] = exec.Command(os.Args[0], "-test.run", "^$")
		logs[w] = &syncbuf.Buffer{}
		cmds[w].Stdout, cmds[w].Stderr = logs[w], logs[w]
		cmds[w].Env = append(os.Environ(), append([]string{workerEnv + "=1", backupEnv + "=" + filepath.Join(dir, "backup"),
			outEnv + "=" + filepath.Join(dir, "out.json"),
			fmt.Sprintf(`TF_CONFIG={"cluster": %s, "task": {"type": "worker", "index": %d}}`, cl, w)}, env...)...)
		require.NoError(t, cmds[w].Start())
	}
	errs := make([]error, 2)
	for w, c := range cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case errs[w] = <-done:
		case <-time.After(2 * time.Minute):
			c.Process.Kill()
			errs[w] = fmt.Errorf("worker %d did not end in 2 minutes; its log:\n%s", w, logs[w].String())
			<-done
		}
		if errs[w] != nil {
			errs[w] = fmt.Errorf("worker %d: %w\n%s", w, errs[w], logs[w].String())
		}
	}
	return errs
}

type jobResult struct {
	Vals         []strategy.VariableValue
	History      *train.History
	LearningRate float64 // after Fit, with PerReplicaBatch
}

// A DiLoCo job (a synchronisation every 5 steps) SIGKILLed after step 19
// resumes from its backup of step 18, between two synchronisations, where
// each worker's parameters and momentum are its own: it ends with the
// model and the last epoch's loss of the job never interrupted.
func TestBackupAndRestoreResumesDiLoCo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two-worker jobs")
	}
	diloco := dilocoEnv + "=5"
	ref := t.TempDir()
	for _, err := range launch(t, ref, diloco) {
		require.NoError(t, err)
	}
	want := readResult(t, ref)
	dir := t.TempDir()
	require.Error(t, launch(t, dir, diloco, killEnv+"=19")[0], "worker 0 was to die after step 19")
	for _, err := range launch(t, dir, diloco) {
		require.NoError(t, err, "resumed after a kill at step 19")
	}
	got := readResult(t, dir)
	diff, name, i := strategy.MaxDiff(want.Vals, got.Vals)
	assert.Zero(t, diff, "%s[%d]", name, i)
	last := backupEpochs - 1 - got.History.Epochs[0]
	assert.Equal(t, want.History.Values["loss"][backupEpochs-1], got.History.Values["loss"][last], "the last epoch's loss")
}

func readResult(t *testing.T, dir string) jobResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "out.json"))
	require.NoError(t, err)
	var r jobResult
	require.NoError(t, json.Unmarshal(b, &r))
	return r
}

// A two-worker job SIGKILLed at a random step, and launched again, ends
// with the model of the job never interrupted (every element within
// 1e-6), and with its last epoch's logs; the backup is gone once training
// has ended. -backup-kills kills, as many resumes.
func TestBackupAndRestoreSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two-worker jobs")
	}
	ref := t.TempDir()
	for _, err := range launch(t, ref) {
		require.NoError(t, err)
	}
	want := readResult(t, ref)
	total := backupEpochs * 10
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for run := range *kills {
		dir := t.TempDir()
		at := 1 + rng.IntN(total-1)
		errs := launch(t, dir, fmt.Sprintf("%s=%d", killEnv, at))
		require.Error(t, errs[0], "run %d: worker 0 was to die at step %d", run, at)
		for _, err := range launch(t, dir) {
			require.NoError(t, err, "run %d: resumed after a kill at step %d", run, at)
		}
		got := readResult(t, dir)
		diff, name, i := strategy.MaxDiff(want.Vals, got.Vals)
		assert.Less(t, diff, 1e-6, "run %d, killed at step %d: %s[%d]", run, at, name, i)
		last := backupEpochs - 1 - got.History.Epochs[0]
		assert.InDelta(t, want.History.Values["loss"][backupEpochs-1], got.History.Values["loss"][last], 1e-6, "run %d: the last epoch's loss", run)
		assert.NoDirExists(t, filepath.Join(dir, "backup"), "run %d", run)
	}
}
