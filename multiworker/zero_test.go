package multiworker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// trainOn trains the model of plan with opt on n workers of replicas
// replicas each with opts, and returns each worker's outcome and engine
// statistics.
func trainOn(t *testing.T, n, replicas int, opt func() strategy.Optimizer, plan testmodel.Plan, opts ...multiworker.Option) ([]testmodel.Outcome, []collective.Stats) {
	t.Helper()
	got := make([]testmodel.Outcome, n)
	stats := make([]collective.Stats, n)
	opts = append(opts, multiworker.WithLogicalCPUs(replicas),
		multiworker.WithStartupTimeout(30*time.Second), multiworker.WithCollectiveTimeout(30*time.Second))
	errs := onWorkers(loopbackSpec(t, n), opts, func(w int, s *multiworker.Strategy) error {
		p := plan
		p.FirstReplica = replicas * w
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
// variable and slot element by element, on 2 and 3 workers and with 2
// replicas a worker, at both stages: the elementwise optimizers (SGD,
// Momentum, Adam, AdamW) and DP-SGD's noise bit for bit, since the
// reduce-scatter gives each element the all-reduce's bits, on its direct
// path and its ring (the MLP of 1100 hidden units packs 330 KiB); LAMB,
// LARS and clipping by the global norm to rounding, since their norms sum
// the shards' parts.
func TestZeROMatchesUnsharded(t *testing.T) {
	mlp := testmodel.Plan{Model: "mlp", Steps: 20, MicroBatches: []int{48}}
	wide, lenet := mlp, mlp
	wide.Hidden, wide.Steps = 1100, 8
	lenet.Model, lenet.Steps = "lenet", 8
	private := func() strategy.Optimizer { return testmodel.PrivateSGD(t, 1, 24) }
	for _, c := range []struct {
		name        string
		opt         func() strategy.Optimizer
		plan        testmodel.Plan
		n, replicas int
		tol         float64
	}{
		{"adam", adam, mlp, 2, 1, 0},
		{"adam", adam, mlp, 2, 2, 0},
		{"adamw", adamW, mlp, 3, 1, 0},
		{"sgd-wide", sgd, wide, 3, 1, 0},
		{"adam-lenet", adam, lenet, 2, 1, 0},
		{"dpsgd", private, mlp, 2, 1, 0},
		{"lossscale", lossScaled, mlp, 3, 1, 0},
		{"lamb", lamb, mlp, 3, 1, 1e-6},
		{"lars", lars, mlp, 2, 1, 1e-6},
		{"clip", clipped, mlp, 3, 1, 1e-6},
	} {
		t.Run(fmt.Sprintf("%s/%dx%d", c.name, c.n, c.replicas), func(t *testing.T) {
			want, _ := trainOn(t, c.n, c.replicas, c.opt, c.plan)
			for _, stage := range []int{1, 2} {
				got, stats := trainOn(t, c.n, c.replicas, c.opt, c.plan, multiworker.WithZeRO(stage))
				assert.Positive(t, stats[0].ReduceScatters, "stage %d reduce-scatters", stage)
				for w := range got {
					d, at := testmodel.MaxVarDiff(want[0], got[w])
					assert.LessOrEqual(t, d, c.tol, "stage %d, worker %d: %s", stage, w, at)
				}
			}
		})
	}
}
