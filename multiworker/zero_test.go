package multiworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// trainOn trains the model of plan with opt on n workers of replicas
// replicas each with opts, and returns each worker's outcome and engine
// statistics.
func trainOn(t *testing.T, n, replicas int, opt func() strategy.Optimizer, plan testmodel.Plan, opts ...multiworker.Option) ([]testmodel.Outcome, []collective.Stats) {
	t.Helper()
	return trainOnAt(t, n, replicas, opt, plan, nil, opts...)
}

// trainOnAt is trainOn that calls at(w, s, done) where plan.AfterRuns
// would be called on worker w, whose strategy is s.
func trainOnAt(t *testing.T, n, replicas int, opt func() strategy.Optimizer, plan testmodel.Plan,
	at func(w int, s *multiworker.Strategy, done int) error, opts ...multiworker.Option) ([]testmodel.Outcome, []collective.Stats) {
	t.Helper()
	got := make([]testmodel.Outcome, n)
	stats := make([]collective.Stats, n)
	opts = append(opts, multiworker.WithLogicalCPUs(replicas),
		multiworker.WithStartupTimeout(30*time.Second), multiworker.WithCollectiveTimeout(30*time.Second))
	errs := onWorkers(loopbackSpec(t, n), opts, func(w int, s *multiworker.Strategy) error {
		p := plan
		p.FirstReplica = replicas * w
		if at != nil {
			p.AfterRuns = func(done int) error { return at(w, s, done) }
		}
		var err error
		got[w], err = testmodel.TrainPlan(context.Background(), s, opt(), p)
		stats[w] = s.CollectiveStats()
		return err
	})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return got, stats
}

// trainCounting is trainOnAt that also returns the bytes worker 0 sent a
// step, from the end of the first step to the end of the last.
func trainCounting(t *testing.T, n, replicas int, opt func() strategy.Optimizer, plan testmodel.Plan,
	at func(w int, s *multiworker.Strategy, done int) error, opts ...multiworker.Option) ([]testmodel.Outcome, float64) {
	t.Helper()
	var first, last collective.Stats
	got, _ := trainOnAt(t, n, replicas, opt, plan, func(w int, s *multiworker.Strategy, done int) error {
		switch {
		case w == 0 && done == 1:
			first = s.CollectiveStats()
		case w == 0 && done == plan.Steps:
			last = s.CollectiveStats()
		}
		if at == nil {
			return nil
		}
		return at(w, s, done)
	}, opts...)
	return got, float64(last.BytesSent-first.BytesSent) / float64(plan.Steps-1)
}

func adamW() strategy.Optimizer {
	o, err := optimizer.NewAdamW(optimizer.Constant(0.01), optimizer.WithWeightDecay(0.01))
	if err != nil {
		panic(err)
	}
	return o
}

func lamb() strategy.Optimizer {
	o, err := optimizer.NewLAMB(optimizer.Constant(0.01), optimizer.WithWeightDecay(0.01))
	if err != nil {
		panic(err)
	}
	return o
}

func lars() strategy.Optimizer {
	o, err := optimizer.NewLARS(optimizer.Constant(0.1))
	if err != nil {
		panic(err)
	}
	return o
}

func clipped() strategy.Optimizer {
	o, err := optimizer.ClipByGlobalNorm(adam(), 0.5)
	if err != nil {
		panic(err)
	}
	return o
}

func lossScaled() strategy.Optimizer {
	o, err := optimizer.NewLossScale(adam(), optimizer.WithInitialScale(1<<10))
	if err != nil {
		panic(err)
	}
	return o
}

// Sharded optimizer state trains the model unsharded training does, every
// variable and slot element by element, on 2, 3 and 4 workers (LAMB over
// 200 steps) and with 2 replicas a worker, at both stages, bit for bit: the reduce-scatter
// gives each element the all-reduce's bits, on its direct path and its
// ring (the MLP of 1100 hidden units packs 330 KiB), for the elementwise
// optimizers (SGD, Momentum, Adam, AdamW) and DP-SGD's noise; LAMB, LARS
// and clipping by the global norm sum their squares in float64, where
// the shards' sums add up to the whole's float32 norm.
func TestZeROMatchesUnsharded(t *testing.T) {
	mlp := testmodel.Plan{Model: "mlp", Steps: 20, MicroBatches: []int{48}}
	wide, lenet, long := mlp, mlp, mlp
	wide.Hidden, wide.Steps = 1100, 8
	lenet.Model, lenet.Steps = "lenet", 8
	long.Steps = 200
	private := func() strategy.Optimizer { return testmodel.PrivateSGD(t, 1, 24) }
	for _, c := range []struct {
		name        string
		opt         func() strategy.Optimizer
		plan        testmodel.Plan
		n, replicas int
	}{
		{"adam", adam, mlp, 2, 1},
		{"adam", adam, mlp, 2, 2},
		{"adamw", adamW, mlp, 3, 1},
		{"sgd-wide", sgd, wide, 3, 1},
		{"adam-lenet", adam, lenet, 2, 1},
		{"dpsgd", private, mlp, 2, 1},
		{"lossscale", lossScaled, mlp, 3, 1},
		{"lamb", lamb, mlp, 3, 1},
		{"lamb-200-steps", lamb, long, 4, 1},
		{"lars", lars, mlp, 2, 1},
		{"clip", clipped, mlp, 3, 1},
	} {
		t.Run(fmt.Sprintf("%s/%dx%d", c.name, c.n, c.replicas), func(t *testing.T) {
			want, _ := trainOn(t, c.n, c.replicas, c.opt, c.plan)
			for _, stage := range []int{1, 2} {
				got, stats := trainOn(t, c.n, c.replicas, c.opt, c.plan, multiworker.WithZeRO(stage))
				assert.Positive(t, stats[0].ReduceScatters, "stage %d reduce-scatters", stage)
				for w := range got {
					d, at := testmodel.MaxVarDiff(want[0], got[w])
					assert.Zero(t, d, "stage %d, worker %d: %s", stage, w, at)
				}
			}
		})
	}
}

// A sharded job's checkpoint holds every slot whole under its usual name:
// saved by 3 workers at stage 2 after 6 of 12 steps, it is byte for byte
// the unsharded job's, Python TensorFlow reads every variable and slot of
// it as the job held them, and it resumes an unsharded job of 2 workers, a
// stage-1 job of 2 workers and the default strategy, each of which ends
// where the uninterrupted unsharded job ends, to the rounding of summing
// over other numbers of replicas.
func TestZeROCheckpointMovesBetweenJobs(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 12, MicroBatches: []int{48}}
	const saved = 6
	want, _ := trainOn(t, 2, 1, adam, plan)
	dir := t.TempDir()
	prefix := func(job string, w int) string { return filepath.Join(dir, job, fmt.Sprintf("worker_%d", w), "ckpt") }
	first := plan
	first.Steps = saved
	var saved3 []testmodel.Outcome
	for job, opts := range map[string][]multiworker.Option{"unsharded": nil, "sharded": {multiworker.WithZeRO(2)}} {
		got, _ := trainOnAt(t, 3, 1, adam, first, func(w int, s *multiworker.Strategy, done int) error {
			if done != saved {
				return nil
			}
			saver, err := checkpoint.NewSaver(s)
			if err != nil {
				return err
			}
			return saver.Save(context.Background(), prefix(job, w), nil)
		}, opts...)
		if job == "sharded" {
			saved3 = got
		}
	}
	for _, file := range []func(string) string{checkpoint.IndexFile, func(p string) string { return checkpoint.DataFile(p, 0, 1) }} {
		sharded, err := os.ReadFile(file(prefix("sharded", 0)))
		require.NoError(t, err)
		unsharded, err := os.ReadFile(file(prefix("unsharded", 0)))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(sharded, unsharded), "%s: the sharded job's checkpoint is the unsharded job's", file(""))
	}
	entries, err := checkpoint.List(prefix("sharded", 0))
	require.NoError(t, err)
	shapes := map[string][]int64{}
	for _, e := range entries {
		shapes[e.Name] = e.Shape
	}
	assert.Equal(t, []int64{64, 32}, shapes["mlp/dense_0/kernel/Adam/m"], "a slot is saved whole")
	assert.Equal(t, []int64{10}, shapes["mlp/dense_1/bias/Adam/v"], "a slot is saved whole")

	py := pyenv.ReadCheckpoint(t, prefix("sharded", 0))
	for _, v := range saved3[0].Vars {
		require.Contains(t, py, v.Name, "Python reads every variable")
		assert.Equal(t, v.Shape, py[v.Name].Shape, "Python reads %s whole", v.Name)
		want := make([]float64, len(v.Float32))
		for i, x := range v.Float32 {
			want[i] = float64(x)
		}
		assert.Equal(t, want, py[v.Name].Values, "Python reads the values of %s", v.Name)
	}

	rest := plan
	rest.Start = saved
	restore := func(w int, done int, e checkpoint.Source) error {
		if done != saved {
			return nil
		}
		saver, err := checkpoint.NewSaver(e)
		if err != nil {
			return err
		}
		_, err = saver.Restore(context.Background(), prefix("sharded", w))
		return err
	}
	for _, c := range []struct {
		name string
		opts []multiworker.Option
	}{{"unsharded", nil}, {"stage 1", []multiworker.Option{multiworker.WithZeRO(1)}}} {
		got, _ := trainOnAt(t, 2, 1, adam, rest, func(w int, s *multiworker.Strategy, done int) error { return restore(w, done, s) }, c.opts...)
		for w := range got {
			d, at := testmodel.MaxVarDiff(want[0], got[w])
			assert.Less(t, d, 1e-5, "%s, worker %d: %s", c.name, w, at)
		}
	}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	rest.AfterRuns = func(done int) error { return restore(0, done, def) }
	got, err := testmodel.TrainPlan(context.Background(), def, adam(), rest)
	require.NoError(t, err)
	d, at := testmodel.MaxVarDiff(want[0], got)
	assert.Less(t, d, 1e-5, "default strategy: %s", at)
}

// Sharding divides the optimizer state by the workers at the traffic of
// the unsharded all-reduce: on 3 workers each holds a third of every
// Adam slot's elements (the blocks of the buckets, to an element), the
// thirds add up to the whole, and a step sends what an unsharded step
// sends, within 1%, where the MLP of 1100 hidden units packs 330 KiB of
// gradients (the all-reduce's ring path).
func TestZeROShardsStateAtTheSameTraffic(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Hidden: 1100, Steps: 6, MicroBatches: []int{48}}
	const n = 3
	var perStep [2]float64
	slots, whole := make([]int64, n), make([]int64, n)
	for i, opts := range [][]multiworker.Option{nil, {multiworker.WithZeRO(2)}} {
		_, perStep[i] = trainCounting(t, n, 1, adam, plan, func(w int, s *multiworker.Strategy, done int) error {
			if done == plan.Steps && i == 1 {
				var err error
				slots[w], whole[w], err = slotElements(s)
				return err
			}
			return nil
		}, opts...)
	}
	t.Logf("bytes a step: unsharded %.0f, sharded %.0f (%.4f)", perStep[0], perStep[1], perStep[1]/perStep[0])
	assert.InDelta(t, 1, perStep[1]/perStep[0], 0.01, "a sharded step sends what an unsharded step sends")
	var sum int64
	for w, got := range slots {
		assert.InDelta(t, float64(whole[w])/n, float64(got), 4, "worker %d holds a third of the slots' %d elements", w, whole[w])
		sum += got
	}
	assert.Equal(t, whole[0], sum, "the workers' shards add up to the slots")
}

// slotElements returns the elements of the Adam slots that s holds on its
// first replica, and those of the whole slots, and checks that HeldBytes
// counts the bytes of those it holds.
func slotElements(s *multiworker.Strategy) (held, whole int64, err error) {
	for _, v := range s.Variables() {
		if !strings.Contains(v.Name(), "/Adam/") {
			continue
		}
		copies, err := s.Copies(context.Background(), v)
		if err != nil {
			return 0, 0, err
		}
		held += int64(copies[0].Shape()[0])
		if b, err := s.HeldBytes(v); err != nil || b != 4*copies[0].Shape()[0] {
			return 0, 0, fmt.Errorf("HeldBytes(%s) = %d, %v; its copy holds %d float32s", v.Name(), b, err, copies[0].Shape()[0])
		}
		n := int64(1)
		for _, d := range v.Shape() {
			n *= d
		}
		whole += n
	}
	return held, whole, nil
}

// WithZeRO is refused, on every worker, with a stage that does not exist
// and with the options it cannot go with, each error naming both.
func TestZeRORefused(t *testing.T) {
	for _, c := range []struct {
		opts []multiworker.Option
		want string
	}{
		{[]multiworker.Option{multiworker.WithZeRO(3)}, "WithZeRO(3): expected stage 1 (optimizer state sharded) or 2 (gradients too)"},
		{[]multiworker.Option{multiworker.WithZeRO(1), multiworker.WithCommunication(multiworker.Ring)}, "WithZeRO(1) with WithCommunication(ring): only tfdist's collective engine reduce-scatters"},
		{[]multiworker.Option{multiworker.WithZeRO(2), multiworker.WithCompression(multiworker.TopK(0.1))}, "WithZeRO(2) with WithCompression(topk(0.1)): a reduce-scatter sends every element of a block, not the largest; use float32, fp16, bf16 or int8"},
		{[]multiworker.Option{multiworker.WithZeRO(2), multiworker.WithAggregation(aggregate.Median())}, "WithZeRO(2) with WithAggregation(median)"},
		{[]multiworker.Option{multiworker.WithZeRO(2), multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4})}, "WithZeRO(2) with WithLocalSGD"},
		{[]multiworker.Option{multiworker.WithZeRO(2), multiworker.WithDeterministic(4)}, "WithZeRO(2) with WithDeterministic(4)"},
	} {
		errs := onWorkers(loopbackSpec(t, 2), c.opts, func(int, *multiworker.Strategy) error { return nil })
		for _, err := range errs {
			require.ErrorContains(t, err, c.want)
		}
	}
	errs := onWorkers(loopbackSpec(t, 1), []multiworker.Option{multiworker.WithZeRO(1)}, func(int, *multiworker.Strategy) error { return nil })
	require.ErrorContains(t, errs[0], "WithZeRO(1) on one worker: the optimizer state is sharded across workers; run two or more")

}

// A sharded step that accumulates gradients over 3 micro-steps trains the
// model the unsharded step trains, slots and accumulators included: at
// stage 1 from whole accumulators, to the rounding of a count reduced on
// its own; at stage 2 from accumulated blocks of the reduced gradients,
// which sum the micro-steps after the replicas rather than before, to
// that rounding grown over 10 steps of Adam. Stage 1 holds the unsharded
// accumulators, one a replica; stage 2 a worker's block of them, once:
// on 2 workers of 2 replicas, a quarter of the bytes.
func TestZeROAccumulates(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 10, MicroBatches: []int{24, 48, 24}}
	held := make([]int64, 3)
	at := func(stage int) func(w int, s *multiworker.Strategy, done int) error {
		return func(w int, s *multiworker.Strategy, done int) error {
			if w != 0 || done != plan.Steps*len(plan.MicroBatches) {
				return nil
			}
			for _, v := range s.Variables() {
				if strings.HasSuffix(v.Name(), "/accumulation/gradient") {
					n, err := s.HeldBytes(v)
					if err != nil {
						return err
					}
					held[stage] += n
				}
			}
			return nil
		}
	}
	want, _ := trainOnAt(t, 2, 2, adam, plan, at(0))
	for _, c := range []struct {
		stage int
		tol   float64
	}{{1, 1e-6}, {2, 1e-5}} {
		got, _ := trainOnAt(t, 2, 2, adam, plan, at(c.stage), multiworker.WithZeRO(c.stage))
		for w := range got {
			d, where := testmodel.MaxVarDiff(want[0], got[w])
			assert.Less(t, d, c.tol, "stage %d, worker %d: %s", c.stage, w, where)
		}
	}
	assert.Positive(t, held[0])
	assert.Equal(t, held[0], held[1], "stage 1 holds whole accumulators")
	assert.InDelta(t, 0.25, float64(held[2])/float64(held[0]), 0.01, "stage 2 holds a worker's block once: %d of %d bytes", held[2], held[0])
}

// A sharded step's reduce-scatters and all-gathers are timeline spans of
// their own, named by their op, and the reduce-scatters count in the
// bytes and times of reductions that Prometheus serves, as many bytes as
// the unsharded all-reduces.
func TestZeROIsObserved(t *testing.T) {
	rec := timeline.New(1 << 12)
	plan := testmodel.Plan{Model: "mlp", Steps: 3, MicroBatches: []int{48}}
	reduced := map[int]float64{}
	for _, stage := range []int{0, 1} {
		m := monitoring.New("worker")
		opts := []multiworker.Option{multiworker.WithMonitoring(m)}
		if stage > 0 {
			opts = append(opts, multiworker.WithZeRO(stage), multiworker.WithTimeline(rec))
		}
		trainOn(t, 2, 1, adam, plan, opts...)
		reduced[stage] = value(t, m.AllReducedBytes)
	}
	assert.Positive(t, reduced[0])
	assert.Equal(t, reduced[0], reduced[1], "bytes reduced, unsharded and sharded")
	spans, _ := rec.Spans()
	ops := map[string]int{}
	for _, s := range spans {
		if s.Phase != timeline.Collective {
			continue
		}
		b, err := json.Marshal(s.Args)
		require.NoError(t, err)
		var args struct{ Op string }
		require.NoError(t, json.Unmarshal(b, &args))
		ops[args.Op]++
	}
	assert.GreaterOrEqual(t, ops["reduce-scatter"], 2*plan.Steps, "a reduce-scatter a step on each worker: %v", ops)
	assert.GreaterOrEqual(t, ops["all-gather"], 2*plan.Steps, "an all-gather a step on each worker: %v", ops)
}

// With fp16 or bf16 compression a sharded step reduce-scatters 16-bit
// gradients and all-gathers float32 parameters, 0.75 of an uncompressed
// sharded step's bytes, and trains with SGD the model that compressed
// unsharded training trains, to the rounding of 16 bits: on 2 workers of
// 2 replicas, where the MLP of 1100 hidden units packs 330 KiB.
func TestZeROCompresses(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Hidden: 1100, Steps: 6, MicroBatches: []int{48}}
	perStep := func(opts ...multiworker.Option) ([]testmodel.Outcome, float64) {
		return trainCounting(t, 2, 2, sgd, plan, nil, opts...)
	}
	_, plain := perStep(multiworker.WithZeRO(1))
	exact, _ := trainOn(t, 2, 2, sgd, plan)
	for _, comp := range []multiworker.Compression{multiworker.FP16, multiworker.BF16} {
		want, _ := trainOn(t, 2, 2, sgd, plan, multiworker.WithCompression(comp))
		got, bytes := perStep(multiworker.WithZeRO(1), multiworker.WithCompression(comp))
		assert.Equal(t, got[0].Params, got[1].Params, "%v: both workers hold the same bits", comp)
		d, at := testmodel.MaxParamDiff(want[0], got[0])
		assert.Less(t, d, 5e-2, "%v: against unsharded compressed training: %s", comp, at)
		d, _ = testmodel.MaxParamDiff(exact[0], got[0])
		assert.NotZero(t, d, "%v: the gradients were rounded", comp)
		t.Logf("%v: %.3g from float32 training", comp, d)
		assert.InDelta(t, 0.75, bytes/plain, 0.01, "%v: bytes a step against uncompressed sharding", comp)
		t.Logf("%v: %.4f of the bytes", comp, bytes/plain)
	}
}

// With int8 compression a sharded step reduce-scatters each bucket as the
// compressed all-reduce sends it and all-gathers float32 parameters, so it
// trains the model of compressed unsharded training bit for bit, every
// variable and slot, on 2 workers of 2 replicas, with Adam, at both
// stages: on the all-reduce's ring (the MLP of 4000 hidden units, whose
// kernel is 1 MiB), a step sends 0.63 of an uncompressed sharded step's
// bytes (a quarter of the gradients', then the parameters' whole); on its
// direct path (1100 units, 330 KiB), whose members all-gather their whole
// levels, 0.75 on 2 workers.
func TestZeROCompressesToInt8(t *testing.T) {
	for _, c := range []struct {
		hidden int
		ratio  float64
	}{{4000, 0.63}, {1100, 0.75}} {
		plan := testmodel.Plan{Model: "mlp", Hidden: c.hidden, Steps: 6, MicroBatches: []int{48}}
		int8 := multiworker.WithCompression(multiworker.INT8)
		want, _ := trainOn(t, 2, 2, adam, plan, int8)
		exact, _ := trainOn(t, 2, 2, adam, plan)
		d, _ := testmodel.MaxVarDiff(exact[0], want[0])
		require.NotZero(t, d, "hidden %d: int8 rounds the gradients", c.hidden)
		_, plain := trainCounting(t, 2, 2, adam, plan, nil, multiworker.WithZeRO(1))
		for _, stage := range []int{1, 2} {
			got, bytes := trainCounting(t, 2, 2, adam, plan, nil, multiworker.WithZeRO(stage), int8)
			for w := range got {
				d, at := testmodel.MaxVarDiff(want[0], got[w])
				assert.Zero(t, d, "hidden %d, stage %d, worker %d: %s", c.hidden, stage, w, at)
			}
			assert.InDelta(t, c.ratio, bytes/plain, 0.01, "hidden %d, stage %d: bytes a step against uncompressed sharding", c.hidden, stage)
		}
	}
}
