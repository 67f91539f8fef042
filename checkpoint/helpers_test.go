package checkpoint

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

const globalBatch = 32

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// engine is what the tests need of a strategy: the contract, checkpoints,
// and reads of every copy.
type engine interface {
	strategy.Strategy
	Source
	Copies(ctx context.Context, v strategy.Variable) ([]*tf.Tensor, error)
}

// newEngine returns a mirrored strategy on n logical CPUs, or the default
// strategy when n is 0.
func newEngine(t *testing.T, n int) engine {
	t.Helper()
	var e engine
	if n == 0 {
		d, err := onedevice.New()
		require.NoError(t, err)
		e = d
	} else {
		m, err := mirrored.New(mirrored.WithLogicalCPUs(n), mirrored.WithThreads(1, 2))
		require.NoError(t, err)
		e = m
	}
	t.Cleanup(func() { e.Close() })
	return e
}

var (
	digitsOnce sync.Once
	digitsData digits.Data
	digitsErr  error
)

func loadDigits(t *testing.T) digits.Data {
	t.Helper()
	digitsOnce.Do(func() { digitsData, digitsErr = digits.Load() })
	require.NoError(t, digitsErr)
	return digitsData
}

// trainer is an MLP on the digits with a compiled training step.
type trainer struct {
	e    engine
	mlp  *nn.MLP
	step strategy.Step
	data digits.Data
}

// newTrainer builds the model and its step on e with the optimizer opt
// returns (a fresh one per strategy).
func newTrainer(t *testing.T, e engine, opt strategy.Optimizer) *trainer {
	t.Helper()
	tr := &trainer{e: e, data: loadDigits(t)}
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		tr.mlp, err = nn.NewMLP(sc, "mlp", []int{digits.Features, 32, digits.Classes}, 1)
		return err
	}))
	spec := strategy.InputSpec{
		"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}},
		"y": {DType: tf.Int32, Shape: []int64{-1}},
	}
	var err error
	tr.step, err = e.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := tr.mlp.Apply(rc, in["x"])
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(rc.Scope().SubScope("loss"), logits, in["y"], digits.Classes))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, tr.mlp.Vars())
	})
	require.NoError(t, err)
	return tr
}

// run trains global steps [from, to): step k always sees the same global
// batch, whatever the number of replicas.
func (tr *trainer) run(t *testing.T, from, to int) {
	t.Helper()
	n := tr.e.NumLocalReplicas()
	per := globalBatch / n
	for k := from; k < to; k++ {
		start := (k * globalBatch) % (tr.data.Len() - globalBatch)
		feeds := make([]dataset.Element, n)
		for r := range n {
			lo, hi := start+r*per, start+(r+1)*per
			x, err := tf.NewTensor(tr.data.X[lo:hi])
			require.NoError(t, err)
			y, err := tf.NewTensor(tr.data.Y[lo:hi])
			require.NoError(t, err)
			feeds[r] = map[string]*tf.Tensor{"x": x, "y": y}
		}
		_, err := tr.e.Run(testContext(t), tr.step, &dataset.Batch{Replicas: feeds, GlobalCount: globalBatch})
		require.NoError(t, err)
	}
}

// values returns the primary value of every variable of e, by name.
func values(t *testing.T, e engine) map[string]*tf.Tensor {
	t.Helper()
	out := map[string]*tf.Tensor{}
	for _, v := range e.Variables() {
		val, err := e.Value(testContext(t), v)
		require.NoError(t, err, v.Name())
		out[v.Name()] = val
	}
	return out
}

// copies reads every copy of v, on its replica's device.
func copies(t *testing.T, e engine, v strategy.Variable) []*tf.Tensor {
	t.Helper()
	res, err := e.Copies(testContext(t), v)
	require.NoError(t, err)
	return res
}

// flat returns a numeric tensor's elements as float64.
func flat(t *testing.T, x *tf.Tensor) []float64 {
	t.Helper()
	var out []float64
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case float32:
			out = append(out, float64(x))
		case float64:
			out = append(out, x)
		case int32:
			out = append(out, float64(x))
		case int64:
			out = append(out, float64(x))
		case []float32:
			for _, e := range x {
				out = append(out, float64(e))
			}
		case []float64:
			out = append(out, x...)
		case []int32:
			for _, e := range x {
				out = append(out, float64(e))
			}
		case []int64:
			for _, e := range x {
				out = append(out, float64(e))
			}
		case [][]float32:
			for _, r := range x {
				walk(r)
			}
		default:
			t.Fatalf("flat: unsupported %T", v)
		}
	}
	walk(x.Value())
	return out
}

// requireClose checks that got equals want to rel relative to want's
// largest magnitude.
func requireClose(t *testing.T, want, got *tf.Tensor, rel float64, msg string) {
	t.Helper()
	require.Equal(t, want.Shape(), got.Shape(), msg)
	w, g := flat(t, want), flat(t, got)
	scale := 0.0
	for _, x := range w {
		scale = math.Max(scale, math.Abs(x))
	}
	for i := range w {
		require.LessOrEqualf(t, math.Abs(w[i]-g[i]), rel*scale+1e-12, "%s: element %d: want %g, got %g", msg, i, w[i], g[i])
	}
}

func sgd() strategy.Optimizer  { return optimizer.NewSGD(optimizer.Constant(0.1)) }
func adam() strategy.Optimizer { return optimizer.NewAdam(optimizer.Constant(0.01)) }

func saveable(t *testing.T, e engine, name string) strategy.Saveable {
	t.Helper()
	for _, v := range e.State().Saveables() {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no variable %q", name)
	return strategy.Saveable{}
}
