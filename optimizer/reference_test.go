package optimizer_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// refState is one variable of a float64 reference optimizer: its value,
// and its momentum or moments.
type refState struct {
	w, a, m, v []float64
}

// refStep updates variable i at step t (from 0) with gradient g.
type refStep func(t, i int, s *refState, g []float64)

// runRef applies step to vars over grads in float64 and returns every
// variable's value after each step.
func runRef(vars []variable, grads [][][]float32, step refStep) [][][]float64 {
	st := make([]*refState, len(vars))
	for i, v := range vars {
		n := len(v.init)
		st[i] = &refState{w: make([]float64, n), a: make([]float64, n), m: make([]float64, n), v: make([]float64, n)}
		for j, x := range v.init {
			st[i].w[j] = float64(x)
		}
	}
	var out [][][]float64
	for t, gs := range grads {
		var now [][]float64
		for i, s := range st {
			g := make([]float64, len(gs[i]))
			for j, x := range gs[i] {
				g[j] = float64(x)
			}
			step(t, i, s, g)
			now = append(now, append([]float64(nil), s.w...))
		}
		out = append(out, now)
	}
	return out
}

func l2(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v * v
	}
	return math.Sqrt(s)
}

// trust is num/den where both norms are positive, else 1.
func trust(num, den, wNorm, uNorm float64) float64 {
	if wNorm > 0 && uNorm > 0 {
		return num / den
	}
	return 1
}

// larsRef is You, Gitman and Ginsburg (2017), Algorithm 1, with the
// MLPerf reference's ε and Nesterov variant: for each variable, local
// rate λ = η‖w‖/(‖g‖ + β‖w‖ + ε), v = m·v + γ·λ·(g + β·w), w -= v. decay[i]
// and adapt[i] say whether variable i has weight decay β and a trust
// ratio; without, β = 0 and λ = 1.
type larsRef struct {
	lr, momentum, wd, eta, eps float64
	nesterov                   bool
	decay, adapt               []bool
}

func (p larsRef) step(_, i int, s *refState, g []float64) {
	wd := p.wd
	if !p.decay[i] {
		wd = 0
	}
	ratio := 1.0
	if p.adapt[i] {
		wn, gn := l2(s.w), l2(g)
		ratio = trust(p.eta*wn, gn+wd*wn+p.eps, wn, gn)
	}
	for j := range s.w {
		u := p.lr * ratio * (g[j] + wd*s.w[j])
		s.a[j] = p.momentum*s.a[j] + u
		if p.nesterov {
			s.w[j] -= p.momentum*s.a[j] + u
		} else {
			s.w[j] -= s.a[j]
		}
	}
}

// lambRef is You et al. (2019), Algorithm 2 (LAMB) with Adam's bias
// correction: m and v the moments, r = m̂/(√v̂ + ε) + λ·w, and
// w -= η·(‖w‖/‖r‖)·r; decay[i] and adapt[i] as larsRef's.
type lambRef struct {
	lr, beta1, beta2, eps, wd float64
	decay, adapt              []bool
}

func (p lambRef) step(t, i int, s *refState, g []float64) {
	wd := p.wd
	if !p.decay[i] {
		wd = 0
	}
	c1, c2 := 1-math.Pow(p.beta1, float64(t+1)), 1-math.Pow(p.beta2, float64(t+1))
	r := make([]float64, len(g))
	for j := range g {
		s.m[j] = p.beta1*s.m[j] + (1-p.beta1)*g[j]
		s.v[j] = p.beta2*s.v[j] + (1-p.beta2)*g[j]*g[j]
		r[j] = (s.m[j]/c1)/(math.Sqrt(s.v[j]/c2)+p.eps) + wd*s.w[j]
	}
	ratio := 1.0
	if p.adapt[i] {
		wn, rn := l2(s.w), l2(r)
		ratio = trust(wn, rn, wn, rn)
	}
	for j := range s.w {
		s.w[j] -= p.lr * ratio * r[j]
	}
}

// layerProblem is a dense layer's kernel and bias with testProblem's
// gradients; with zeros, the bias starts at 0 (its norm is 0 at the first
// step) and the kernel's gradient is 0 at step 3 — the cases where the
// trust ratio falls back to 1.
func layerProblem(zeros bool) ([]variable, [][][]float32) {
	vars, grads := testProblem()
	vars[0].name, vars[1].name = "dense/kernel", "dense/bias"
	if zeros {
		vars[1].init = make([]float32, len(vars[1].init))
		grads[3][0] = make([]float32, len(grads[3][0]))
	}
	return vars, grads
}

// assertMatchesRef asserts that got is the float64 reference want to 1e-6
// (absolute below 1, relative above): float32 rounding of the same
// formulas stays near 1e-7.
func assertMatchesRef(t *testing.T, vars []variable, want [][][]float64, got [][][]float32) {
	t.Helper()
	require.Len(t, got, len(want))
	for k := range want {
		for i, v := range vars {
			for j := range v.init {
				assertClose(t, want[k][i][j], got[k][i][j], "step %d %s[%d]", k, v.name, j)
			}
		}
	}
}

var (
	both    = []bool{true, true}
	onlyFst = []bool{true, false} // the kernel, not the bias (the default exclusions)
)

// refCase is an optimizer and the reference it should follow on
// layerProblem(zeros).
type refCase struct {
	name  string
	opt   func() (strategy.Optimizer, error)
	ref   refStep
	zeros bool
}

func runRefCases(t *testing.T, cases []refCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt, err := c.opt()
			require.NoError(t, err)
			vars, grads := layerProblem(c.zeros)
			got, iters := trainVars(t, opt, vars, grads)
			assert.EqualValues(t, len(grads), iters)
			assertMatchesRef(t, vars, runRef(vars, grads, c.ref), got)
		})
	}
}

// lars and lamb build the optimizer under test.
func lars(lr optimizer.Schedule, opts ...optimizer.Option) func() (strategy.Optimizer, error) {
	return func() (strategy.Optimizer, error) { return optimizer.NewLARS(lr, opts...) }
}

func lamb(lr optimizer.Schedule, opts ...optimizer.Option) func() (strategy.Optimizer, error) {
	return func() (strategy.Optimizer, error) { return optimizer.NewLAMB(lr, opts...) }
}

// LARS updates each variable as the paper's rule, its trust ratio from the
// variable's own norms; biases are excluded from weight decay and the
// trust ratio by default, and a zero norm makes the ratio 1.
func TestLARSMatchesPaper(t *testing.T) {
	eta, wd := optimizer.WithTrustCoefficient(0.02), optimizer.WithWeightDecay(0.05)
	runRefCases(t, []refCase{
		{"defaults", lars(nil), larsRef{lr: 0.01, momentum: 0.9, wd: 1e-4, eta: 0.001, decay: onlyFst, adapt: onlyFst}.step, false},
		{"bias_excluded", lars(optimizer.Constant(0.5), eta, wd, optimizer.WithMomentum(0.8)),
			larsRef{lr: 0.5, momentum: 0.8, wd: 0.05, eta: 0.02, decay: onlyFst, adapt: onlyFst}.step, false},
		{"nothing_excluded_nesterov_zero_norms", lars(optimizer.Constant(0.5), eta, wd, optimizer.WithNesterov(true),
			optimizer.WithEpsilon(1e-3), optimizer.ExcludeFromWeightDecay()),
			larsRef{lr: 0.5, momentum: 0.9, wd: 0.05, eta: 0.02, eps: 1e-3, nesterov: true, decay: both, adapt: both}.step, true},
		{"kernel_not_adapted_bias_decayed", lars(optimizer.Constant(0.1), eta, wd, optimizer.ExcludeFromWeightDecay(),
			optimizer.ExcludeFromLayerAdaptation("kernel$")),
			larsRef{lr: 0.1, momentum: 0.9, wd: 0.05, eta: 0.02, decay: both, adapt: []bool{false, true}}.step, false},
	})
}

// LAMB updates each variable as the paper's rule (TensorFlow Addons'
// form), with the same exclusions and fallbacks as LARS.
func TestLAMBMatchesPaper(t *testing.T) {
	wd := optimizer.WithWeightDecay(0.1)
	runRefCases(t, []refCase{
		{"defaults", lamb(nil), lambRef{lr: 0.001, beta1: 0.9, beta2: 0.999, eps: 1e-6, decay: onlyFst, adapt: onlyFst}.step, false},
		{"bias_excluded", lamb(optimizer.Constant(0.02), wd, optimizer.WithBetas(0.8, 0.99)),
			lambRef{lr: 0.02, beta1: 0.8, beta2: 0.99, eps: 1e-6, wd: 0.1, decay: onlyFst, adapt: onlyFst}.step, false},
		{"nothing_excluded_zero_norms", lamb(optimizer.Constant(0.02), wd, optimizer.WithEpsilon(1e-4), optimizer.ExcludeFromWeightDecay()),
			lambRef{lr: 0.02, beta1: 0.9, beta2: 0.999, eps: 1e-4, wd: 0.1, decay: both, adapt: both}.step, true},
		{"bias_decayed_not_adapted", lamb(optimizer.Constant(0.02), wd, optimizer.ExcludeFromWeightDecay(), optimizer.ExcludeFromLayerAdaptation("/bias$")),
			lambRef{lr: 0.02, beta1: 0.9, beta2: 0.999, eps: 1e-6, wd: 0.1, decay: both, adapt: []bool{true, false}}.step, false},
	})
}

// The default exclusions cover the names nn gives biases and
// normalization variables, and nothing else of a layer.
func TestDefaultExclusionsCoverNNNames(t *testing.T) {
	excluded := map[string]bool{
		"mlp/dense_0/bias": true, "mlp/conv2d_1/bias": true, "mlp/layer_norm_0/gamma": true, "mlp/layer_norm_0/beta": true,
		"mlp/batch_norm_0/gamma": true, "mlp/batch_norm_0/beta": true, "bias": true, "vit/ln/scale": true, "vit/ln/offset": true,
		"mlp/dense_0/kernel": false, "mlp/conv2d_1/kernel": false, "emb/embeddings": false, "mlp/biased/kernel": false, "beta_net/kernel": false,
	}
	opt, err := optimizer.NewLAMB(optimizer.Constant(0.1), optimizer.WithWeightDecay(0.5))
	require.NoError(t, err)
	// One step from w = 1 with g = 0: r = wd·w moves a decayed variable,
	// and is 0 for an excluded one.
	var vars []variable
	var grads [][]float32
	for name := range excluded {
		vars = append(vars, variable{name, []float32{1, 1}})
		grads = append(grads, []float32{0, 0})
	}
	got, _ := trainVars(t, opt, vars, [][][]float32{grads})
	for i, v := range vars {
		assert.Equal(t, excluded[v.name], got[0][i][0] == 1, "%s excluded: want %v, got w=%v", v.name, excluded[v.name], got[0][i])
	}
}
