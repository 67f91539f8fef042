package optimizer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

var ctx = context.Background()

// train runs one update of w (initially w0) per element of grads under opt
// with the loss sum(w * g), so each step's gradient is the fed g; it
// returns w after each step and the optimizer's step count.
func train(t *testing.T, opt strategy.Optimizer, w0 []float32, grads [][]float32) ([][]float32, int64) {
	t.Helper()
	per := make([][][]float32, len(grads))
	for k, g := range grads {
		per[k] = [][]float32{g}
	}
	steps, iters := trainVars(t, opt, []variable{{"w", w0}}, per)
	out := make([][]float32, len(steps))
	for k, st := range steps {
		out[k] = st[0]
	}
	return out, iters
}

// variable is a float32 vector variable of a test: its name and initial
// value.
type variable struct {
	name string
	init []float32
}

// trainVars is train for several variables, on the default strategy: the
// loss is the sum over the variables of sum(w * g), grads[k][i] the
// gradient of variable i at step k. It returns every variable's value after
// each step.
func trainVars(t *testing.T, opt strategy.Optimizer, vars []variable, grads [][][]float32) ([][][]float32, int64) {
	t.Helper()
	r := newDefaultRun(t, opt, vars)
	var out [][][]float32
	for _, g := range grads {
		r.step(t, g)
		out = append(out, r.values(t))
	}
	var iters int64
	for _, v := range r.s.Variables() {
		if strings.HasSuffix(v.Name(), "/iterations") {
			it, err := r.s.Value(ctx, v)
			require.NoError(t, err)
			iters = it.Value().(int64)
		}
	}
	return out, iters
}

// run is a strategy training vars with linearLoss.
type run struct {
	s    valuer
	ws   []strategy.Variable
	step func(t *testing.T, g [][]float32)
}

// valuer is what a run reads of its strategy.
type valuer interface {
	Value(context.Context, strategy.Variable) (*tf.Tensor, error)
	Variables() []strategy.Variable
	State() strategy.State
}

// values returns the value of every variable of the run.
func (r *run) values(t *testing.T) [][]float32 {
	t.Helper()
	var now [][]float32
	for _, w := range r.ws {
		v, err := r.s.Value(ctx, w)
		require.NoError(t, err)
		now = append(now, v.Value().([]float32))
	}
	return now
}

// newDefaultRun builds the run on a new default strategy.
func newDefaultRun(t *testing.T, opt strategy.Optimizer, vars []variable) *run {
	t.Helper()
	s, err := onedevice.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	r := &run{s: s}
	var spec strategy.InputSpec
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		r.ws, spec, err = createVars(sc, vars)
		return err
	}))
	st, err := s.Build(spec, linearLoss(opt, r.ws))
	require.NoError(t, err)
	r.step = func(t *testing.T, g [][]float32) {
		_, err := s.RunReplicas(ctx, st, []map[string]*tf.Tensor{feeds(t, g)}, 1)
		require.NoError(t, err)
	}
	return r
}

// createVars creates vars in sc, with opts, and returns them and the
// input spec of their gradients.
func createVars(sc strategy.Scope, vars []variable, opts ...strategy.VariableOption) ([]strategy.Variable, strategy.InputSpec, error) {
	ws := make([]strategy.Variable, len(vars))
	spec := strategy.InputSpec{}
	for i, v := range vars {
		init, err := tf.NewTensor(v.init)
		if err != nil {
			return nil, nil, err
		}
		if ws[i], err = sc.Variable(v.name, tf.Float, []int64{int64(len(v.init))}, strategy.Constant(init), opts...); err != nil {
			return nil, nil, err
		}
		spec[fmt.Sprint("g", i)] = strategy.TensorSpec{DType: tf.Float, Shape: []int64{int64(len(v.init))}}
	}
	return ws, spec, nil
}

// linearLoss is a step that minimizes with opt the sum over ws of
// sum(w * g_i), g_i the input "g<i>": the gradient of ws[i] is g_i.
func linearLoss(opt strategy.Optimizer, ws []strategy.Variable) strategy.ReplicaFn {
	return func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		var terms []tf.Output
		for i, w := range ws {
			sc := rc.Scope().SubScope(fmt.Sprint("loss_", i))
			terms = append(terms, op.Sum(sc, op.Mul(sc.SubScope("mul"), strategy.MustRead(rc, w), in[fmt.Sprint("g", i)]), op.Const(sc.SubScope("axis"), int32(0))))
		}
		loss := op.AddN(rc.Scope().SubScope("loss"), terms)
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, ws)
	}
}

// feeds is the step's input for the gradients g of one step.
func feeds(t *testing.T, g [][]float32) map[string]*tf.Tensor {
	t.Helper()
	in := map[string]*tf.Tensor{}
	for i, gi := range g {
		x, err := tf.NewTensor(gi)
		require.NoError(t, err)
		in[fmt.Sprint("g", i)] = x
	}
	return in
}

var grads = [][]float32{{1, -2}, {0.5, 0.5}, {-1, 3}}

func TestSGD(t *testing.T) {
	got, iters := train(t, optimizer.NewSGD(optimizer.Constant(0.1)), []float32{1, 1}, grads)
	w := []float64{1, 1}
	for k, g := range grads {
		for i := range w {
			w[i] -= 0.1 * float64(g[i])
			assert.InDelta(t, w[i], got[k][i], 1e-6, "step %d", k)
		}
	}
	assert.Equal(t, int64(3), iters)
}

func TestMomentum(t *testing.T) {
	for _, nesterov := range []bool{false, true} {
		got, _ := train(t, optimizer.NewMomentum(optimizer.Constant(0.1), 0.9, nesterov), []float32{1, 1}, grads)
		w, a := []float64{1, 1}, []float64{0, 0}
		for k, g := range grads {
			for i := range w {
				a[i] = 0.9*a[i] + float64(g[i])
				if nesterov {
					w[i] -= 0.1 * (float64(g[i]) + 0.9*a[i])
				} else {
					w[i] -= 0.1 * a[i]
				}
				assert.InDelta(t, w[i], got[k][i], 1e-6, "nesterov=%v step %d", nesterov, k)
			}
		}
	}
}

func TestAdam(t *testing.T) {
	got, iters := train(t, optimizer.NewAdam(optimizer.Constant(0.01)), []float32{1, 1}, grads)
	const b1, b2, eps, lr = 0.9, 0.999, 1e-7, 0.01
	w, m, v := []float64{1, 1}, []float64{0, 0}, []float64{0, 0}
	for k, g := range grads {
		t1 := float64(k + 1)
		lrT := lr * math.Sqrt(1-math.Pow(b2, t1)) / (1 - math.Pow(b1, t1))
		for i := range w {
			gi := float64(g[i])
			m[i] = b1*m[i] + (1-b1)*gi
			v[i] = b2*v[i] + (1-b2)*gi*gi
			w[i] -= lrT * m[i] / (math.Sqrt(v[i]) + eps)
			assert.InDelta(t, w[i], got[k][i], 1e-5, "step %d", k)
		}
	}
	assert.Equal(t, int64(3), iters)
}

// testProblem is what the comparisons with Keras and the references apply: a kernel and a bias, and 10
// steps of gradients drawn in [-1.5, 1.5) (global norm about 2.5, so
// clipping by global norm 1 and by value 0.5 both bite).
func testProblem() ([]variable, [][][]float32) {
	r := rand.New(rand.NewPCG(19, 2017))
	draw := func(n int, scale float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = scale * (2*r.Float32() - 1)
		}
		return x
	}
	vars := []variable{{"kernel", draw(6, 1)}, {"bias", draw(2, 0.3)}}
	grads := make([][][]float32, 10)
	for k := range grads {
		grads[k] = [][]float32{draw(6, 1.5), draw(2, 1.5)}
	}
	return vars, grads
}

// assertClose asserts that got is want to 1e-6: absolute for values
// below 1 in magnitude, relative above. The optimizers compute in float32;
// the same formulas rounded otherwise (Keras' eager ops, or float64 in a
// reference) differ by a few units in the last place, ~1e-7 of a value.
func assertClose(t *testing.T, want float64, got float32, msgAndArgs ...any) bool {
	t.Helper()
	return assert.InDelta(t, want, float64(got), 1e-6*math.Max(1, math.Abs(want)), msgAndArgs...)
}
