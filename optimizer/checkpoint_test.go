package optimizer_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// newPSRun builds the run on a new parameter-server strategy with one
// worker and two ps tasks, in this process, every variable in two shards.
func newPSRun(t *testing.T, opt strategy.Optimizer, vars []variable) *run {
	t.Helper()
	cl, err := paramserver.StartInProcessCluster(1, 2, paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	s, err := paramserver.New(ctx, cl.Resolver(), paramserver.WithStepTimeout(30*time.Second), paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	r := &run{s: s}
	var spec strategy.InputSpec
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		r.ws, spec, err = createVars(sc, vars, strategy.WithPartitioner(paramserver.FixedShards(2)))
		return err
	}))
	fn, err := s.Build(spec, linearLoss(opt, r.ws))
	require.NoError(t, err)
	c, err := paramserver.NewCoordinator(s)
	require.NoError(t, err)
	t.Cleanup(func() { c.Done(ctx) })
	r.step = func(t *testing.T, g [][]float32) {
		in := dataset.Element{}
		for name, x := range feeds(t, g) {
			in[name] = x
		}
		rv, err := c.Schedule(fn, paramserver.Feed(in))
		require.NoError(t, err)
		_, err = rv.Get(ctx)
		require.NoError(t, err)
	}
	return r
}

// An optimizer's whole state — slots and step count — is checkpointed:
// training 4 steps, saving, restoring into a fresh strategy (a fresh
// cluster for the parameter-server strategy) and training on gives exactly
// the variables of the run that went on without a break. The schedule
// warms up over the break, so a step count restored wrong changes the
// rate.
func TestCheckpointResumesExactly(t *testing.T) {
	warm := optimizer.Warmup{Steps: 6, Initial: 0.001, Then: optimizer.CosineDecay{Initial: 0.02, DecaySteps: 4}}
	opts := map[string]func() (strategy.Optimizer, error){
		"AdamW": func() (strategy.Optimizer, error) { return optimizer.NewAdamW(warm, optimizer.WithWeightDecay(0.1)) },
		"LAMB":  func() (strategy.Optimizer, error) { return optimizer.NewLAMB(warm, optimizer.WithWeightDecay(0.1)) },
	}
	runs := map[string]func(*testing.T, strategy.Optimizer, []variable) *run{"default": newDefaultRun, "paramserver": newPSRun}
	vars, grads := layerProblem(false)
	const brk = 4
	for sname, newRun := range runs {
		for oname, newOpt := range opts {
			t.Run(sname+"/"+oname, func(t *testing.T) {
				opt, err := newOpt()
				require.NoError(t, err)
				a := newRun(t, opt, vars)
				for _, g := range grads[:brk] {
					a.step(t, g)
				}
				prefix := filepath.Join(t.TempDir(), "ckpt")
				sa, err := checkpoint.NewSaver(a.s)
				require.NoError(t, err)
				require.NoError(t, sa.Save(ctx, prefix, nil))
				entries, err := checkpoint.List(prefix)
				require.NoError(t, err)
				var names []string
				for _, e := range entries {
					names = append(names, e.Name)
				}
				for _, v := range []string{"dense/kernel", "dense/bias"} {
					assert.Subset(t, names, []string{v, v + "/" + oname + "/m", v + "/" + oname + "/v"})
				}
				assert.Contains(t, names, oname+"/iterations")
				var want [][][]float32
				for _, g := range grads[brk:] {
					a.step(t, g)
					want = append(want, a.values(t))
				}

				b := newRun(t, opt, vars)
				sb, err := checkpoint.NewSaver(b.s)
				require.NoError(t, err)
				_, err = sb.Restore(ctx, prefix)
				require.NoError(t, err)
				for k, g := range grads[brk:] {
					b.step(t, g)
					require.Equal(t, want[k], b.values(t), "step %d after the restore", k)
				}
			})
		}
	}
}

// Under the parameter-server strategy each shard of a variable has its own
// trust ratio, from its own rows, and an exclusion holds for every shard of
// the variables it names ("dense/bias/part_1" is a bias): LARS and LAMB on
// two shards of each variable are the papers' rules applied to each shard
// as a variable of its own.
func TestTrustRatioIsPerShardUnderPS(t *testing.T) {
	vars, grads := layerProblem(false)
	// FixedShards(2) splits the kernel's 6 rows 3+3, the bias's 2 rows 1+1.
	var shards []variable
	for _, v := range vars {
		h := len(v.init) / 2
		shards = append(shards, variable{v.name + "/part_0", v.init[:h]}, variable{v.name + "/part_1", v.init[h:]})
	}
	shardGrads := make([][][]float32, len(grads))
	for k, gs := range grads {
		for _, g := range gs {
			h := len(g) / 2
			shardGrads[k] = append(shardGrads[k], g[:h], g[h:])
		}
	}
	kernelOnly := []bool{true, true, false, false}
	cases := []struct {
		name string
		opt  func() (strategy.Optimizer, error)
		ref  refStep
	}{
		{"LARS", lars(optimizer.Constant(0.5), optimizer.WithTrustCoefficient(0.02), optimizer.WithWeightDecay(0.05)), larsRef{lr: 0.5, momentum: 0.9, wd: 0.05, eta: 0.02, decay: kernelOnly, adapt: kernelOnly}.step},
		{"LAMB", lamb(optimizer.Constant(0.02), optimizer.WithWeightDecay(0.1)), lambRef{lr: 0.02, beta1: 0.9, beta2: 0.999, eps: 1e-6, wd: 0.1, decay: kernelOnly, adapt: kernelOnly}.step},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, err := c.opt()
			require.NoError(t, err)
			r := newPSRun(t, opt, vars)
			want := runRef(shards, shardGrads, c.ref)
			for k, g := range grads {
				r.step(t, g)
				got := r.values(t)
				for i, v := range vars {
					whole := append(append([]float64(nil), want[k][2*i]...), want[k][2*i+1]...)
					for j := range v.init {
						assertClose(t, whole[j], got[i][j], "step %d %s[%d]", k, v.name, j)
					}
				}
			}
		})
	}
}
