package multiworker_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// localSGDSteps trains testmodel.Linear for steps steps on 2 workers in
// one process with cfg, each worker on its half of every global batch, and
// returns each worker's weights.
func localSGDSteps(t *testing.T, steps int, cfg multiworker.LocalSGD, opts ...multiworker.Option) [2][]float32 {
	got, _ := localSGDRun(t, steps, cfg, opts...)
	return got
}

// localSGDRun is localSGDSteps, which also returns worker 0's collective
// stats.
func localSGDRun(t *testing.T, steps int, cfg multiworker.LocalSGD, opts ...multiworker.Option) ([2][]float32, collective.Stats) {
	return localSGDRunWith(t, linearSGD, steps, cfg, opts...)
}

// linearSGD is testmodel.Linear's optimizer in these tests.
func linearSGD() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(elasticLR)) }

// localSGDRunWith is localSGDRun with the optimizer of newOpt.
func localSGDRunWith(t *testing.T, newOpt func() strategy.Optimizer, steps int, cfg multiworker.LocalSGD, opts ...multiworker.Option) ([2][]float32, collective.Stats) {
	var got [2][]float32
	var sent collective.Stats
	errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithLocalSGD(cfg),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, opts...),
		func(w int, s *multiworker.Strategy) error {
			l, err := testmodel.NewLinearWith(s, newOpt())
			if err != nil {
				return err
			}
			per := elasticGlobal / 2
			for step := range steps {
				if _, err := l.Run(context.Background(), step*elasticGlobal+w*per, per); err != nil {
					return err
				}
			}
			got[w], err = l.Weights(context.Background())
			if w == 0 {
				sent = s.CollectiveStats()
			}
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return got, sent
}

// Local SGD that synchronises after every step, averaging the workers'
// parameters, trains with SGD the model synchronous training does: one
// device's on the global batches.
func TestLocalSGDEveryStepIsSynchronous(t *testing.T) {
	const steps = 30
	want := linearOnOneDevice(t, steps)
	got := localSGDSteps(t, steps, multiworker.LocalSGD{Steps: 1})
	for w := range got {
		assert.InDeltaSlice(t, want, got[w], 1e-6, "worker %d", w)
	}
}

// The warm-up's steps are synchronous: with Adam, whose moments a worker
// alone would keep its own, both workers end the warm-up with the
// parameters one device trains on the global batches, on 1 and 2 replicas
// a worker; a local step after it moves them apart.
func TestLocalSGDWarmupIsSynchronous(t *testing.T) {
	const warm = 6
	want := linearOnOneDeviceWith(t, adam(), warm)
	cfg := multiworker.LocalSGD{Steps: 5, WarmupSteps: warm}
	for _, replicas := range []int{1, 2} {
		got, _ := localSGDRunWith(t, adam, warm, cfg, multiworker.WithLogicalCPUs(replicas))
		for w := range got {
			assert.InDeltaSlice(t, want, got[w], 1e-6, "worker %d of %d replicas", w, replicas)
		}
	}
	got, _ := localSGDRunWith(t, adam, warm+1, cfg)
	assert.NotEqual(t, got[0], got[1], "after the warm-up each worker steps alone")
}

// adam is an optimizer with state, which local steps would make each
// worker's own.
func adam() strategy.Optimizer { return optimizer.NewAdam(optimizer.Constant(0.1)) }

// A warm-up as long as training trains the MLP on 2 workers of 2 replicas
// as the default strategy does on the global batches: with Adam, whose
// state every worker must keep alike, its gradients as float32; with SGD,
// and WithCompression, as int8 (Adam's steps make the rounding of
// gradients near 0 whole steps): fewer bytes, the same parameters on both
// workers, near float32's.
func TestLocalSGDWarmupTrainsTheSynchronousModel(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 30, MicroBatches: []int{32}}
	var plain int64
	for _, c := range []struct {
		comp multiworker.Compression
		opt  func() strategy.Optimizer
		tol  float64
	}{{multiworker.None, adam, 1e-5}, {multiworker.None, sgd, 1e-5}, {multiworker.INT8, sgd, 5e-2}} {
		want, err := testmodel.TrainDefault(context.Background(), c.opt(), plan)
		require.NoError(t, err)
		opts := []multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, WarmupSteps: plan.Steps})}
		if c.comp != multiworker.None {
			opts = append(opts, multiworker.WithCompression(c.comp))
		}
		local := plan
		local.Workers = 2
		got, sent := trainTwoByTwo(t, c.opt, local, opts...)
		assertCompressed(t, c.comp, want, got, sent, c.tol, 0.4, &plain)
	}
}

// DiLoCo's outer update, Nesterov momentum on the workers' mean parameter
// change every 5 steps, after a synchronous warm-up of 2 steps, gives every worker the parameters that two independent models,
// synchronised the same way by hand, end with; so it does with two
// replicas on each worker.
func TestDiLoCoEqualsItsDefinition(t *testing.T) {
	const steps = 27 // 2 warm-up steps, then 5 rounds of 5
	cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true, WarmupSteps: 2}
	want := diLoCoByHand(t, steps, cfg)
	var sent [3]int64
	for _, replicas := range []int{1, 2} {
		var got [2][]float32
		var stats collective.Stats
		got, stats = localSGDRun(t, steps, cfg, multiworker.WithLogicalCPUs(replicas))
		sent[replicas] = stats.BytesSent
		for w := range got {
			assert.InDeltaSlice(t, want, got[w], 1e-5, "worker %d of %d replicas", w, replicas)
		}
	}
	assert.Equal(t, sent[1], sent[2], "the link carries the outer gradient once per worker, whatever its replicas")
	assert.NotEqual(t, linearOnOneDevice(t, steps), want, "the outer update trains another model than synchronous SGD")
}

// DiLoCo whose outer gradient travels as int8 gives every worker the
// parameters of its definition by hand, each worker's change rounded to
// 127 levels of its largest, on 1 and 2 replicas a worker; the rounding
// changes the model.
func TestDiLoCoInt8EqualsItsDefinition(t *testing.T) {
	const steps = 27
	cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true, WarmupSteps: 2, Compression: multiworker.INT8}
	want := diLoCoByHand(t, steps, cfg)
	for _, replicas := range []int{1, 2} {
		got := localSGDSteps(t, steps, cfg, multiworker.WithLogicalCPUs(replicas))
		for w := range got {
			assert.InDeltaSlice(t, want, got[w], 1e-6, "worker %d of %d replicas", w, replicas)
		}
	}
	cfg.Compression = multiworker.None
	assert.NotEqual(t, diLoCoByHand(t, steps, cfg), want, "int8 rounds the outer gradient")
}

// diLoCoByHand trains two testmodel.Linear on one device each, on the
// workers' halves of the global batches, and synchronises them as cfg
// says, with TensorFlow's momentum update computed here.
func diLoCoByHand(t *testing.T, steps int, cfg multiworker.LocalSGD) []float32 {
	ctx := context.Background()
	strategies, models := twoOnOneDevice(t, func(e testmodel.Engine) (*testmodel.Linear, error) { return testmodel.NewLinear(e, elasticLR) })
	anchor, err := models[0].Weights(ctx)
	require.NoError(t, err)
	accum := make([]float32, len(anchor))
	lr, mu := float32(cfg.OuterRate), float32(cfg.OuterMomentum)
	per := elasticGlobal / 2
	for step := 1; step <= steps; step++ {
		var ws [2][]float32
		for w, m := range models {
			_, err := m.Run(ctx, (step-1)*elasticGlobal+w*per, per)
			require.NoError(t, err)
			ws[w], err = m.Weights(ctx)
			require.NoError(t, err)
		}
		if step > cfg.WarmupSteps && (step-cfg.WarmupSteps)%cfg.Steps != 0 {
			continue
		}
		mean := make([]float32, len(anchor)) // the workers' mean of (anchor - parameters)
		for i := range anchor {
			mean[i] = (anchor[i] - ws[0][i] + (anchor[i] - ws[1][i])) / 2
			if cfg.Compression == multiworker.INT8 && step > cfg.WarmupSteps { // the warm-up's gradients travel as float32
				mean[i] = int8Mean(anchor, ws, i)
			}
		}
		for i, g := range mean {
			if step <= cfg.WarmupSteps { // SGD's synchronous step: the mean of the workers' steps
				anchor[i] -= g
				continue
			}
			accum[i] = accum[i]*mu + g
			anchor[i] -= g*lr + accum[i]*mu*lr
		}
		for w, m := range models {
			x, err := tf.NewTensor(anchor)
			require.NoError(t, err)
			require.NoError(t, strategies[w].Assign(ctx, m.W, x))
		}
	}
	return anchor
}

// int8Mean is the mean of the workers' (anchor - ws[w])[i] compressed to
// int8 as a small buffer is (the model has fewer than 256 weights, one
// block): each worker's rounded to 127 levels of its own largest
// magnitude, the workers' added in rank order.
func int8Mean(anchor []float32, ws [2][]float32, i int) float32 {
	var sum float32
	for _, w := range ws {
		var m float32
		for k := range anchor {
			m = max(m, float32(math.Abs(float64(anchor[k]-w[k]))))
		}
		if m > 0 {
			sum += float32(math.RoundToEven(float64((anchor[i]-w[i])*(127/m)))) * (m / 127)
		}
	}
	return sum * (float32(1) / 2)
}

// Settings out of range, and options local SGD cannot go with, are errors
// naming them.
func TestLocalSGDBadInput(t *testing.T) {
	for _, c := range []struct {
		opts []multiworker.Option
		want string
	}{
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{})}, "WithLocalSGD: Steps 0: expected at least 1"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, OuterRate: 3})}, "OuterRate 3: expected a learning rate in (0, 2]"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, OuterMomentum: 1})}, "OuterMomentum 1: expected a momentum in [0, 1)"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, WarmupSteps: -1})}, "WarmupSteps -1: expected 0 or more"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, Compression: multiworker.TopK(0.1)})}, "Compression topk(0.1): expected none, fp16, bf16 or int8"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, Fragments: 2})}, "Fragments 2: expected 0, 1 or a divisor of Steps 5"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Fragments: -1})}, "Fragments -1: expected 0, 1 or a divisor of Steps 4"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Fragments: 2, Overlap: 2})}, "Overlap 2: expected 0 or more, less than Steps/Fragments = 2"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Overlap: -1})}, "Overlap -1: expected 0 or more, less than Steps/Fragments = 4"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Mix: 1})}, "Mix 1: expected a share in [0, 1)"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}), multiworker.WithCommunication(multiworker.Ring)}, "WithLocalSGD with WithCommunication(ring)"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}), multiworker.WithCompression(multiworker.FP16)}, "a local step all-reduces no gradient"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, WarmupSteps: 2}), multiworker.WithCompression(multiworker.TopK(0.1))}, "expected fp16, bf16 or int8 with WarmupSteps"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}), multiworker.WithDeterministic(2)}, "WithLocalSGD with WithDeterministic"},
	} {
		_, err := multiworker.New(context.Background(), c.opts...)
		assert.ErrorContains(t, err, c.want)
	}
}

// A step that accumulates gradients is refused under local SGD, which
// would synchronise between its micro-steps.
func TestLocalSGDRefusesAccumulation(t *testing.T) {
	s, err := multiworker.New(context.Background(), multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}))
	require.NoError(t, err)
	defer s.Close()
	_, err = testmodel.NewLinear(s, elasticLR, strategy.WithAccumulation(2))
	assert.ErrorContains(t, err, "WithLocalSGD: a step that accumulates gradients (WithAccumulation)")
}

// More fragments than variables to split is refused when the first
// training step is built, naming both.
func TestLocalSGDRefusesMoreFragmentsThanVariables(t *testing.T) {
	s, err := multiworker.New(context.Background(), multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 4, Fragments: 2}))
	require.NoError(t, err)
	defer s.Close()
	_, err = testmodel.NewLinear(s, elasticLR)
	assert.ErrorContains(t, err, "WithLocalSGD: Fragments 2: expected at most 1, the float32 trainable variables to split")
}

// A checkpoint saved between two synchronisations holds every worker's
// parameters and Adam slots, besides local SGD's outer state: workers
// restored from it go on as the job that saved it did, bit for bit, every
// variable of every worker, with one replica a worker and with two, and
// with an outer gradient in flight (Overlap), which the restored workers
// all-reduce again from their stages, and after a synchronous warm-up.
// Saved in the warm-up or right after a synchronisation, it holds the
// parameters' value alone, alike on every worker, and the slots' copies;
// restored in the warm-up, the job goes on synchronously to its end.
func TestLocalSGDResumesBetweenSynchronisations(t *testing.T) {
	const steps = 13 // synchronisations after steps 5 and 10, or after a warm-up of 6 steps and step 11
	for _, c := range []struct{ saved, replicas, overlap, warmup int }{{8, 1, 0, 0}, {8, 2, 0, 0}, {10, 1, 0, 0}, {11, 1, 2, 0}, {3, 2, 0, 6}, {8, 1, 0, 6}} {
		saved, replicas := c.saved, c.replicas
		cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true, WarmupSteps: c.warmup}
		if c.overlap > 0 { // taken after step 10, in flight when saved, lands after step 12
			cfg.Overlap, cfg.Mix = c.overlap, 0.25
		}
		dir := t.TempDir()
		prefix := func(w int) string { return filepath.Join(dir, fmt.Sprintf("worker_%d", w), "ckpt") }
		want := localSGDCheckpointRun(t, cfg, replicas, 0, steps, func(w int, s *multiworker.Strategy, step int) error {
			if step != saved {
				return nil
			}
			saver, err := checkpoint.NewSaver(s)
			if err != nil {
				return err
			}
			return saver.Save(context.Background(), prefix(w), nil)
		})
		assert.NotEqual(t, want[0]["w"], want[1]["w"], "the workers' parameters differ between synchronisations")
		entries, err := checkpoint.List(prefix(0))
		require.NoError(t, err)
		var copies []string
		for _, e := range entries {
			if name, ok := strings.CutPrefix(e.Name, checkpoint.CopiesPrefix); ok {
				copies = append(copies, name)
			}
		}
		assert.Subset(t, copies, []string{"w/Adam/m", "w/Adam/v"}, "every worker's Adam slots")
		if c.overlap == 0 && (saved <= c.warmup || (saved-c.warmup)%cfg.Steps == 0) {
			assert.NotContains(t, copies, "w", "saved in the warm-up or after a synchronisation")
		} else {
			assert.Contains(t, copies, "w", "saved between two synchronisations")
		}
		got := localSGDCheckpointRun(t, cfg, replicas, saved, steps, func(w int, s *multiworker.Strategy, step int) error {
			if step != saved {
				return nil
			}
			saver, err := checkpoint.NewSaver(s)
			if err != nil {
				return err
			}
			_, err = saver.Restore(context.Background(), prefix(0))
			return err
		})
		for w := range want {
			assert.Equal(t, want[w], got[w], "worker %d of %d replicas, saved after step %d: every variable as the uninterrupted job's", w, replicas, saved)
		}
	}
}

// localSGDCheckpointRun trains testmodel.Linear with Adam (or inner's
// optimizer) on 2 workers, under cfg, from step first+1 to last, calling
// at(step) before step+1 (and at(first) before the first), and returns
// each worker's variables by name.
func localSGDCheckpointRun(t *testing.T, cfg multiworker.LocalSGD, replicas, first, last int,
	at func(w int, s *multiworker.Strategy, step int) error, inner ...strategy.Optimizer) [2]map[string][]byte {
	opt := strategy.Optimizer(optimizer.NewAdam(optimizer.Constant(0.05)))
	if len(inner) > 0 {
		opt = inner[0]
	}
	var got [2]map[string][]byte
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLocalSGD(cfg), multiworker.WithLogicalCPUs(replicas),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			ctx := context.Background()
			l, err := testmodel.NewLinearWith(s, opt)
			if err != nil {
				return err
			}
			per := elasticGlobal / 2
			for step := first; step < last; step++ {
				if err := at(w, s, step); err != nil {
					return err
				}
				if _, err := l.Run(ctx, step*elasticGlobal+w*per, per); err != nil {
					return err
				}
			}
			vars := s.Variables()
			values, err := s.Values(ctx, vars)
			if err != nil {
				return err
			}
			got[w] = map[string][]byte{}
			for i, v := range vars {
				var b bytes.Buffer
				if _, err := values[i].WriteContentsTo(&b); err != nil {
					return err
				}
				got[w][v.Name()] = b.Bytes()
			}
			return nil
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return got
}

// The outer update keeps a step count of its own: an inner optimizer of
// the same kind (momentum, whose schedule reads its count) counts the
// training steps alone.
func TestLocalSGDOuterStepCountIsItsOwn(t *testing.T) {
	const steps = 6
	got := localSGDCheckpointRun(t, multiworker.LocalSGD{Steps: 2, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}, 1, 0, steps,
		func(int, *multiworker.Strategy, int) error { return nil },
		optimizer.NewMomentum(optimizer.Constant(0.05), 0.9, false))
	for w := range got {
		assert.Equal(t, []byte{steps, 0, 0, 0, 0, 0, 0, 0}, got[w]["Momentum/iterations"], "worker %d: the inner optimizer's count", w)
		assert.Equal(t, []byte{steps / 2, 0, 0, 0, 0, 0, 0, 0}, got[w]["tfdist_local_sgd/outer/iterations"], "worker %d: the outer update's count", w)
	}
}

// affine is a model of two variables for the fragments' test: the loss
// (x·w + b - y)², averaged, minimised by SGD, on testmodel.Linear's
// examples.
type affine struct {
	w, b strategy.Variable
	step strategy.Step
	e    testmodel.Engine
}

func newAffine(e testmodel.Engine) (*affine, error) {
	m := &affine{e: e}
	if err := e.Scope(func(sc strategy.Scope) (err error) {
		w0, err := tf.NewTensor([]float32{0.5, -0.25, 0.1})
		if err != nil {
			return err
		}
		if m.w, err = sc.Variable("w", tf.Float, []int64{3}, strategy.Constant(w0)); err != nil {
			return err
		}
		m.b, err = sc.Variable("b", tf.Float, []int64{1}, strategy.Zeros())
		return err
	}); err != nil {
		return nil, err
	}
	var err error
	m.step, err = e.Build(testmodel.LinearSpec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := r.Scope().SubScope("affine")
		xw := op.Squeeze(s.SubScope("pred"), op.MatMul(s.SubScope("matmul"), in["x"],
			op.Reshape(s.SubScope("w"), strategy.MustRead(r, m.w), op.Const(s.SubScope("shape"), []int32{3, 1}))))
		pred := op.AddV2(s.SubScope("bias"), xw, strategy.MustRead(r, m.b))
		loss := r.AverageLoss(op.Square(s.SubScope("square"), op.Sub(s.SubScope("err"), pred, in["y"])))
		return strategy.Outputs{}, r.Minimize(optimizer.NewSGD(optimizer.Constant(elasticLR)), loss, []strategy.Variable{m.w, m.b})
	})
	return m, err
}

// run trains one step on the examples lo..lo+n of testmodel.Linear.
func (m *affine) run(ctx context.Context, lo, n int) error {
	_, err := testmodel.RunLinear(ctx, m.e, m.step, lo, n)
	return err
}

// Streaming DiLoCo's fragments: with 2 fragments (w, then b) and a
// synchronisation every 4 steps, w synchronises after steps 2, 6, 10, 14
// and b after 4, 8, 12, each by DiLoCo's outer update: every worker ends
// with the parameters of its model in two independent models synchronised
// so by hand (b, trained alone since step 12, differs between them).
func TestLocalSGDFragmentsSynchroniseInTurn(t *testing.T) {
	const steps = 14
	cfg := multiworker.LocalSGD{Steps: 4, Fragments: 2, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	want := fragmentsByHand(t, steps, cfg)
	got, _ := affineRun(t, steps, cfg)
	for w := range got {
		for i, name := range []string{"w", "b"} {
			assert.InDeltaSlice(t, want[w][i], got[w][i], 1e-5, "worker %d: %s", w, name)
		}
	}
	assert.Equal(t, got[0][0], got[1][0], "w synchronised after the last step")
	assert.NotEqual(t, got[0][1], got[1][1], "b trained alone since step 12")
}

// fragmentsByHand trains an affine model on one device for each of two
// workers, on their halves of the global batches, and synchronises
// fragment 0 (w) after each step n with n%4 == 2 and fragment 1 (b) after
// n%4 == 0, with TensorFlow's momentum update computed here: each worker's
// outer gradient is taken after that step and lands cfg.Overlap steps
// later, each parameter becoming cfg.Mix of its own and the rest of the
// anchor's. It returns each model's w and b.
func fragmentsByHand(t *testing.T, steps int, cfg multiworker.LocalSGD) [2][][]float32 {
	ctx := context.Background()
	strategies, models := twoOnOneDevice(t, newAffine)
	vars := func(m *affine) []strategy.Variable { return []strategy.Variable{m.w, m.b} }
	read := func(w, f int) []float32 {
		vals, err := floatValues(ctx, strategies[w], vars(models[w])[f])
		require.NoError(t, err)
		return vals[0]
	}
	anchors, err := floatValues(ctx, strategies[0], vars(models[0])...)
	require.NoError(t, err)
	accum := [][]float32{make([]float32, 3), make([]float32, 1)}
	taken := map[int][2][]float32{} // by fragment: each worker's anchor - parameters
	lr, mu, mix := float32(cfg.OuterRate), float32(cfg.OuterMomentum), float32(cfg.Mix)
	land := func(f int) {
		a, d := anchors[f], taken[f]
		for i := range a {
			g := (d[0][i] + d[1][i]) / 2
			accum[f][i] = accum[f][i]*mu + g
			a[i] -= g*lr + accum[f][i]*mu*lr
		}
		for w, m := range models {
			own := read(w, f)
			for i := range own {
				own[i] = mix*own[i] + (1-mix)*a[i]
			}
			x, err := tf.NewTensor(own)
			require.NoError(t, err)
			require.NoError(t, strategies[w].Assign(ctx, vars(m)[f], x))
		}
	}
	turn := func(n int) int { return map[int]int{2: 0, 0: 1, 1: -1, 3: -1}[n%4] }
	per := elasticGlobal / 2
	for step := 1; step <= steps; step++ {
		for w, m := range models {
			require.NoError(t, m.run(ctx, (step-1)*elasticGlobal+w*per, per))
		}
		if cfg.Overlap > 0 && step > cfg.Overlap {
			if f := turn(step - cfg.Overlap); f >= 0 {
				land(f)
			}
		}
		if f := turn(step); f >= 0 {
			var d [2][]float32
			for w := range models {
				d[w] = read(w, f)
				for i := range d[w] {
					d[w][i] = anchors[f][i] - d[w][i]
				}
			}
			taken[f] = d
			if cfg.Overlap == 0 {
				land(f)
			}
		}
	}
	var out [2][][]float32
	for w, m := range models {
		out[w], err = floatValues(ctx, strategies[w], vars(m)...)
		require.NoError(t, err)
	}
	return out
}

// twoOnOneDevice builds two models by build, each on a device of its own:
// two workers' models, for a test to synchronise by hand.
func twoOnOneDevice[M any](t *testing.T, build func(testmodel.Engine) (M, error)) ([2]*onedevice.Strategy, [2]M) {
	var strategies [2]*onedevice.Strategy
	var models [2]M
	for w := range models {
		s, err := onedevice.New()
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		strategies[w] = s
		models[w], err = build(s)
		require.NoError(t, err)
	}
	return strategies, models
}

// floatValues reads the float32 variables vs of e.
func floatValues(ctx context.Context, e strategy.ValueReader, vs ...strategy.Variable) ([][]float32, error) {
	out := make([][]float32, len(vs))
	for i, v := range vs {
		t, err := e.Value(ctx, v)
		if err != nil {
			return nil, err
		}
		out[i] = append([]float32(nil), t.Value().([]float32)...)
	}
	return out, nil
}

// Streaming DiLoCo's overlap: each fragment's outer gradient, taken after
// its turn, lands a step later, a quarter of each parameter the worker's own
// each worker trained meanwhile: every worker ends with the parameters of
// its model in two models synchronised so by hand, with one replica a
// worker and with two.
func TestLocalSGDOverlapLandsLater(t *testing.T) {
	const steps = 15
	cfg := multiworker.LocalSGD{Steps: 4, Fragments: 2, Overlap: 1, Mix: 0.25, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	want := fragmentsByHand(t, steps, cfg)
	for _, replicas := range []int{1, 2} {
		got, _ := affineRun(t, steps, cfg, multiworker.WithLogicalCPUs(replicas))
		for w := range got {
			for i, name := range []string{"w", "b"} {
				assert.InDeltaSlice(t, want[w][i], got[w][i], 1e-5, "worker %d of %d replicas: %s", w, replicas, name)
			}
		}
	}
	noOverlap := cfg
	noOverlap.Overlap, noOverlap.Mix = 0, 0
	assert.NotEqual(t, fragmentsByHand(t, steps, noOverlap), want, "the overlap trains another model")
}

// A synchronisation all-reduces the outer gradients of all its variables
// as one buffer: one all-reduce each, which above the engine's direct
// size takes the ring's bytes, not every variable's own all-reduce.
func TestLocalSGDSynchronisesInOneAllReduce(t *testing.T) {
	const steps = 6
	_, stats := affineRun(t, steps, multiworker.LocalSGD{Steps: 2})
	assert.Equal(t, int64(steps/2), stats.AllReduces, "one all-reduce a synchronisation, of w and b at once")
}

// affineRun trains an affine model on 2 workers under cfg and opts, each worker on
// its half of every global batch, and returns each worker's w and b, and
// worker 0's collective stats.
func affineRun(t *testing.T, steps int, cfg multiworker.LocalSGD, opts ...multiworker.Option) ([2][][]float32, collective.Stats) {
	var got [2][][]float32
	var stats collective.Stats
	errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithLocalSGD(cfg),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, opts...),
		func(w int, s *multiworker.Strategy) error {
			m, err := newAffine(s)
			if err != nil {
				return err
			}
			per := elasticGlobal / 2
			for step := range steps {
				if err := m.run(context.Background(), step*elasticGlobal+w*per, per); err != nil {
					return err
				}
			}
			if w == 0 {
				stats = s.CollectiveStats()
			}
			got[w], err = floatValues(context.Background(), s, m.w, m.b)
			return err
		})
	for w, err := range errs {
		require.NoError(t, err, "worker %d", w)
	}
	return got, stats
}
