package multiworker_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
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

// localSGDRun is localSGDSteps, which also returns the bytes worker 0 sent.
func localSGDRun(t *testing.T, steps int, cfg multiworker.LocalSGD, opts ...multiworker.Option) ([2][]float32, int64) {
	var got [2][]float32
	var sent int64
	errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithLocalSGD(cfg),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)}, opts...),
		func(w int, s *multiworker.Strategy) error {
			l, err := testmodel.NewLinear(s, elasticLR)
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
				sent = s.CollectiveStats().BytesSent
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

// DiLoCo's outer update, Nesterov momentum on the workers' mean parameter
// change every 5 steps, after a warm-up of 2 steps synchronised every
// step, gives every worker the parameters that two independent models,
// synchronised the same way by hand, end with; so it does with two
// replicas on each worker.
func TestDiLoCoEqualsItsDefinition(t *testing.T) {
	const steps = 27 // 2 warm-up steps, then 5 rounds of 5
	cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true, WarmupSteps: 2}
	want := diLoCoByHand(t, steps, cfg)
	var sent [3]int64
	for _, replicas := range []int{1, 2} {
		var got [2][]float32
		got, sent[replicas] = localSGDRun(t, steps, cfg, multiworker.WithLogicalCPUs(replicas))
		for w := range got {
			assert.InDeltaSlice(t, want, got[w], 1e-5, "worker %d of %d replicas", w, replicas)
		}
	}
	assert.Equal(t, sent[1], sent[2], "the link carries the outer gradient once per worker, whatever its replicas")
	assert.NotEqual(t, linearOnOneDevice(t, steps), want, "the outer update trains another model than synchronous SGD")
}

// diLoCoByHand trains two testmodel.Linear on one device each, on the
// workers' halves of the global batches, and synchronises them as cfg
// says, with TensorFlow's momentum update computed here.
func diLoCoByHand(t *testing.T, steps int, cfg multiworker.LocalSGD) []float32 {
	ctx := context.Background()
	var models [2]*testmodel.Linear
	var strategies [2]*onedevice.Strategy
	for w := range models {
		s, err := onedevice.New()
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		strategies[w] = s
		models[w], err = testmodel.NewLinear(s, elasticLR)
		require.NoError(t, err)
	}
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
		for i := range anchor {
			g := (anchor[i] - ws[0][i] + (anchor[i] - ws[1][i])) / 2
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
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5, Compression: multiworker.TopK(0.1)})}, "Compression topk(0.1): expected none, fp16 or bf16"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}), multiworker.WithCommunication(multiworker.Ring)}, "WithLocalSGD with WithCommunication(ring)"},
		{[]multiworker.Option{multiworker.WithLocalSGD(multiworker.LocalSGD{Steps: 5}), multiworker.WithCompression(multiworker.FP16)}, "a local step all-reduces no gradient"},
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

// A checkpoint saved between two synchronisations holds every worker's
// parameters and Adam slots, besides local SGD's outer state: workers
// restored from it go on as the job that saved it did, bit for bit, every
// variable of every worker, with one replica a worker and with two. Saved
// right after a synchronisation, it holds the parameters' value alone,
// alike on every worker, and the slots' copies.
func TestLocalSGDResumesBetweenSynchronisations(t *testing.T) {
	const steps = 13 // synchronisations after steps 5 and 10
	cfg := multiworker.LocalSGD{Steps: 5, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}
	for _, c := range []struct{ saved, replicas int }{{8, 1}, {8, 2}, {10, 1}} {
		saved, replicas := c.saved, c.replicas
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
		if saved%cfg.Steps == 0 {
			assert.NotContains(t, copies, "w", "saved after a synchronisation")
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
			assert.Equal(t, want[w], got[w], "worker %d of %d replicas: every variable as the uninterrupted job's", w, replicas)
		}
	}
}

// localSGDCheckpointRun trains testmodel.Linear with Adam on 2 workers,
// under cfg, from step first+1 to last, calling at(step) before step+1
// (and at(first) before the first), and returns each worker's variables
// by name.
func localSGDCheckpointRun(t *testing.T, cfg multiworker.LocalSGD, replicas, first, last int,
	at func(w int, s *multiworker.Strategy, step int) error) [2]map[string][]byte {
	var got [2]map[string][]byte
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithLocalSGD(cfg), multiworker.WithLogicalCPUs(replicas),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			ctx := context.Background()
			l, err := testmodel.NewLinearWith(s, optimizer.NewAdam(optimizer.Constant(0.05)))
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
