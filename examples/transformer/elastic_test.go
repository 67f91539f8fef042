package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/elastic"
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
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	step   int // the last "step N/M" line's N
	report string
	exited chan struct{}
	err    error
}

func startWorker(t *testing.T, addr, name string, args []string) *worker {
	w := &worker{name: name, exited: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run", "^$")
	w.cmd.Env = append(os.Environ(), argsEnv+"="+strings.Join(args, " "),
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

// A Transformer trained as an elastic job that loses a worker at a random
// step and takes a replacement ends bit for bit with the model one device
// trains: the survivor goes on in its own process from the last step,
// in the same place in the data, and no window of the text is trained on
// twice or skipped.
func TestElasticJobLosesNoBit(t *testing.T) {
	o, args := elasticRun(t)
	want := fitOn(t, o, o.dist)

	srv, err := elastic.Listen("127.0.0.1:0", elastic.WithJob("transformer-test"), elastic.WithMembers(1, 2))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served }()

	ws := []*worker{startWorker(t, srv.Addr(), "worker:0", args), startWorker(t, srv.Addr(), "worker:1", args)}
	victim, at := rand.IntN(2), 6+2*rand.IntN(15)
	require.Eventually(t, func() bool { return max(ws[0].steps(), ws[1].steps()) >= at }, 3*time.Minute, time.Millisecond)
	require.NoError(t, ws[victim].cmd.Process.Kill())
	finishers := []*worker{ws[1-victim], startWorker(t, srv.Addr(), ws[victim].name, args)}
	reports := 0
	for _, w := range finishers {
		select {
		case <-w.exited:
		case <-time.After(3 * time.Minute):
			t.Fatalf("%s did not exit", w.name)
		}
		require.NoError(t, w.err, w.name)
		if w.report == "" {
			continue // not the chief
		}
		reports++
		var got report
		require.NoError(t, json.Unmarshal([]byte(w.report), &got))
		assert.Equal(t, want.ParamsSHA256, got.ParamsSHA256, "%s, %s killed after step %d", w.name, ws[victim].name, at)
		assert.Equal(t, want.TrainLosses, got.TrainLosses, "every epoch's loss")
		assert.Equal(t, want.HeldOutLoss, got.HeldOutLoss)
	}
	assert.Equal(t, 1, reports, "the chief reports")
}
