package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/classifier"
)

// The same seed, data and topology give the same model, bit for bit, run
// after run (equal params_sha256): the default strategy, mirrored on 2
// devices and 2 workers of 2 devices, three runs each; one of the
// multi-worker runs is killed (SIGKILL) after step 57 and resumes from its
// checkpoint of step 40, and still ends with the others' model. Under
// parameter servers, whose workers apply their updates as they arrive,
// only one worker stepping alone has an order of updates to repeat: three
// runs of a chief, one worker and one ps task end with one model.
func TestRunsAreReproducible(t *testing.T) {
	needBinaries(t)
	args := []string{"-steps", "100", "-global-batch", "32", "-log-every", "0", "-json"}
	for _, s := range []struct{ strategy, devices string }{{"default", "1"}, {"mirrored", "2"}} {
		runs := map[string]classifier.Result{}
		for i := range 3 {
			res, err := classifier.Run(context.Background(), options(t, append(args, "-strategy", s.strategy, "-devices", s.devices)...), io.Discard)
			require.NoError(t, err)
			runs[fmt.Sprintf("run %d", i)] = res
		}
		assertOneModel(t, runs, s.strategy+": three runs")
	}

	runs := map[string]classifier.Result{}
	for i := range 3 {
		f, launchArgs := classifier.Faults{}, []string{"--workers", "2"}
		if i == 2 {
			f = classifier.Faults{CrashAtStep: 57, CrashTask: "worker:1"}
			launchArgs = append(launchArgs, "--max-restarts", "1", "--grace", "5s")
		}
		out, err := launchFaulty(t, f, 4*time.Minute, launchArgs, append(args, "-strategy", "multiworker", "-devices", "2",
			"-checkpoint-dir", t.TempDir(), "-checkpoint-every", "20", "-collective-timeout", "10s")...)
		require.NoError(t, err, out)
		if i == 2 {
			assert.Contains(t, out, "resuming after step 40")
		}
		got := results(t, out)
		require.Len(t, got, 2, out)
		assertOneModel(t, got, "the workers of one run")
		runs[fmt.Sprintf("run %d", i)] = got["worker:0"]
	}
	assertOneModel(t, runs, "multiworker 2×2: three runs, the last killed and resumed")

	runs = map[string]classifier.Result{}
	for i := range 3 {
		out, err := launch(t, 2*time.Minute, []string{"--chief", "--workers", "1", "--ps", "1"}, append(args, "-strategy", "ps")...)
		require.NoError(t, err, out)
		got := results(t, out)
		require.Contains(t, got, "chief:0", out)
		runs[fmt.Sprintf("run %d", i)] = got["chief:0"]
	}
	assertOneModel(t, runs, "ps with one worker: three runs")
}

// With -deterministic 8 (8 virtual shards), LeNet with batch
// normalisation trains the same model, bit for bit, on one device, on 4
// devices, and on 2 workers of 2 devices (processes under tfdist launch);
// without it, 4 devices train another model than one does, so the
// comparison can fail.
func TestTopologiesTrainOneModel(t *testing.T) {
	needBinaries(t)
	args := []string{"-model", "lenet-bn", "-steps", "40", "-global-batch", "32", "-log-every", "0", "-json"}
	run := func(strategy, devices string, more ...string) classifier.Result {
		res, err := classifier.Run(context.Background(), options(t, append(append(args, "-strategy", strategy, "-devices", devices), more...)...), io.Discard)
		require.NoError(t, err)
		return res
	}
	v := []string{"-deterministic", "8"}
	models := map[string]classifier.Result{"default": run("default", "1", v...), "mirrored ×4": run("mirrored", "4", v...)}
	addLaunched(t, models, "multiworker 2×2 ", append(append(args, v...), "-strategy", "multiworker", "-devices", "2")...)
	assertOneModel(t, models, "-deterministic 8 on 1, 4 and 2×2 replicas")

	plain := run("mirrored", "4")
	assert.NotEqual(t, run("default", "1").ParamsSHA256, plain.ParamsSHA256, "without -deterministic, 4 devices sum in another order")
}

// With -deterministic 8 the model's bits depend on the number of threads
// in each process's TensorFlow intra-op pool (some of LeNet's kernels split
// a sum by thread), which defaults to the cores the process may use. So
// processes given one core (taskset) and processes with
// TF_NUM_INTRAOP_THREADS=1 on every core train one model: one device
// pinned to a core, and 4 devices or 2 workers of 2 that set the variable; the
// default on every core trains another, so the comparison can fail.
func TestThreadCountDecidesTheBits(t *testing.T) {
	needBinaries(t)
	if runtime.NumCPU() < 2 {
		t.Skipf("needs 2 cores to run with more than one thread, has %d", runtime.NumCPU())
	}
	args := []string{"-model", "lenet-bn", "-steps", "40", "-global-batch", "32", "-log-every", "0", "-json", "-deterministic", "8"}
	run := func(env []string, cmd ...string) classifier.Result {
		c := exec.Command(cmd[0], append(cmd[1:], args...)...)
		c.Env = append(append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2"), env...)
		out, err := c.CombinedOutput()
		require.NoError(t, err, "%s", out)
		var res classifier.Result
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "{") {
				require.NoError(t, json.Unmarshal([]byte(line), &res), line)
			}
		}
		require.NotEmpty(t, res.ParamsSHA256, "%s", out)
		return res
	}
	models := map[string]classifier.Result{"one device on one core": run(nil, "taskset", "-c", "0", bins.digits)}
	t.Setenv("TF_NUM_INTRAOP_THREADS", "1")
	models["4 devices, TF_NUM_INTRAOP_THREADS=1"] = run(nil, bins.digits, "-strategy", "mirrored", "-devices", "4")
	addLaunched(t, models, "2×2, TF_NUM_INTRAOP_THREADS=1, ", append(args, "-strategy", "multiworker", "-devices", "2")...)
	assertOneModel(t, models, "one intra-op thread in every process")
	every := run([]string{"TF_NUM_INTRAOP_THREADS="}, bins.digits)
	assert.NotEqual(t, models["one device on one core"].ParamsSHA256, every.ParamsSHA256, "%d intra-op threads sum in another order", runtime.NumCPU())
}

// addLaunched runs the digits program with args on 2 workers under tfdist
// launch and adds each worker's result to models, named prefix and its
// task.
func addLaunched(t *testing.T, models map[string]classifier.Result, prefix string, args ...string) {
	t.Helper()
	out, err := launch(t, 4*time.Minute, []string{"--workers", "2"}, args...)
	require.NoError(t, err, out)
	got := results(t, out)
	require.Len(t, got, 2, out)
	for task, res := range got {
		models[prefix+task] = res
	}
}
