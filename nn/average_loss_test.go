package nn_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// stepEngine is what the loss tests need of an in-graph strategy.
type stepEngine interface {
	Build(strategy.InputSpec, strategy.ReplicaFn) (strategy.Step, error)
	RunReplicas(context.Context, strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
	NumLocalReplicas() int
}

// flatTensor is a tensor as the Python script reads it.
type flatTensor struct {
	Shape  []int64 `json:"shape"`
	Values any     `json:"values"`
}

// lossCase is one request to testdata/keras_losses.py: each replica's
// logits, labels and sample weights, and the global batch size given to
// tf.nn.compute_average_loss.
type lossCase struct {
	Name            string       `json:"name"`
	Logits          []flatTensor `json:"logits"`
	Labels          []flatTensor `json:"labels"`
	Weights         []flatTensor `json:"weights,omitempty"`
	GlobalBatchSize int          `json:"global_batch_size"`
	Keras           bool         `json:"keras"`
	// perExample is the shape of the per-example loss after its leading
	// axis; weight the input spec of the sample weight, nil when there is
	// none.
	perExample, weight []int64
	examples           int // the sum of every replica's leading dimension
}

// lossAnswer is what the script computes for a case.
type lossAnswer struct {
	PerExample        [][]float64 `json:"per_example"`
	AverageLoss       float64     `json:"compute_average_loss"`
	AverageLossGlobal float64     `json:"compute_average_loss_global"`
	SumOverBatchSize  float64     `json:"sum_over_batch_size"`
	Sum               float64     `json:"sum"`
	None              [][]float64 `json:"none"`
}

const (
	lossClasses = 5
	lossTime    = 4
)

// lossCases returns every layout of loss and weights for each replica's
// number of sequences in batches: per example [b], per token [b, T] and
// per token flattened [b·T].
func lossCases(batches []int) []lossCase {
	var cases []lossCase
	for _, layout := range []struct {
		name       string
		rows       func(b int) []int64 // the per-example loss's shape
		weight     func(b int) []int64 // nil: unweighted
		scalar     bool
		keras      bool
		perExample []int64
	}{
		{"example", func(b int) []int64 { return []int64{int64(b)} }, func(b int) []int64 { return []int64{int64(b)} }, false, true, nil},
		{"example_unweighted", func(b int) []int64 { return []int64{int64(b)} }, nil, false, true, nil},
		{"example_scalar_weight", func(b int) []int64 { return []int64{int64(b)} }, nil, true, true, nil},
		{"token", func(b int) []int64 { return []int64{int64(b), lossTime} }, func(b int) []int64 { return []int64{int64(b), lossTime} }, false, true, []int64{lossTime}},
		{"token_unweighted", func(b int) []int64 { return []int64{int64(b), lossTime} }, nil, false, true, []int64{lossTime}},
		// Keras would broadcast [b] against [b, T]'s last axis; TensorFlow
		// expands it to [b, 1].
		{"token_example_weight", func(b int) []int64 { return []int64{int64(b), lossTime} }, func(b int) []int64 { return []int64{int64(b)} }, false, false, []int64{lossTime}},
		{"flat", func(b int) []int64 { return []int64{int64(b * lossTime)} }, func(b int) []int64 { return []int64{int64(b * lossTime)} }, false, true, nil},
	} {
		c := lossCase{Name: fmt.Sprintf("%s_%v", layout.name, batches), Keras: layout.keras, perExample: layout.perExample}
		for r, b := range batches {
			shape := layout.rows(b)
			n := int(numValues(shape))
			c.examples += int(shape[0])
			logits, labels := make([]float32, n*lossClasses), make([]int32, n)
			for i := range logits {
				logits[i] = float32(2 * math.Sin(float64(7*r+13*i+3)))
			}
			for i := range labels {
				labels[i] = int32((3*i + r) % lossClasses)
			}
			c.Logits = append(c.Logits, flatTensor{append(append([]int64{}, shape...), lossClasses), logits})
			c.Labels = append(c.Labels, flatTensor{shape, labels})
			switch {
			case layout.scalar:
				c.Weights, c.weight = append(c.Weights, flatTensor{[]int64{}, []float32{0.5 + 1.5*float32(r)}}), []int64{}
			case layout.weight != nil:
				ws := layout.weight(b)
				w := make([]float32, numValues(ws))
				for i := range w {
					w[i] = float32((5*i+r)%4) / 2 // 0, 0.5, 1, 1.5
				}
				c.Weights, c.weight = append(c.Weights, flatTensor{ws, w}), append([]int64{-1}, ws[1:]...)
			}
		}
		c.GlobalBatchSize = c.examples
		cases = append(cases, c)
	}
	return cases
}

func numValues(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// lossStep builds the step that reduces the loss fed as "loss", weighted
// by "w" when the case has weights, in every way the case compares: each
// reduction summed over the replicas as a reduced output, and None per
// replica.
func lossStep(c lossCase) (strategy.InputSpec, strategy.ReplicaFn) {
	spec := strategy.InputSpec{"loss": {DType: tf.Float, Shape: append([]int64{-1}, c.perExample...)}}
	if c.weight != nil {
		spec["w"] = strategy.TensorSpec{DType: tf.Float, Shape: c.weight}
	}
	return spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		var opts []nn.LossOption
		if w, ok := in["w"]; ok {
			opts = append(opts, nn.SampleWeight(w))
		}
		reduced := map[string]tf.Output{"average_loss": r.AverageLoss(in["loss"])}
		var err error
		if reduced["compute_average_loss"], err = nn.ComputeAverageLoss(r, in["loss"], opts...); err != nil {
			return nil, err
		}
		if reduced["compute_average_loss_global"], err = nn.ComputeAverageLoss(r, in["loss"], append(opts, nn.GlobalBatchSize(c.GlobalBatchSize))...); err != nil {
			return nil, err
		}
		out := strategy.Outputs{}
		if c.Keras {
			for _, red := range []nn.Reduction{nn.SumOverBatchSize, nn.Sum} {
				if reduced[red.String()], err = nn.ReduceLoss(r, in["loss"], red, opts...); err != nil {
					return nil, err
				}
			}
			if out["none"], err = nn.ReduceLoss(r, in["loss"], nn.None, opts...); err != nil {
				return nil, err
			}
		}
		for name, v := range reduced {
			if err := r.ReduceOutput(name, strategy.Sum, v); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

// runLossCase runs c's step once on e, each replica fed its per-example
// losses (the script's, so that both sides reduce the same values) and
// weights.
func runLossCase(t *testing.T, e stepEngine, c lossCase, perExample [][]float64) strategy.Result {
	t.Helper()
	spec, fn := lossStep(c)
	step, err := e.Build(spec, fn)
	require.NoError(t, err)
	feeds := make([]map[string]*tf.Tensor, e.NumLocalReplicas())
	for r := range feeds {
		shape := c.Labels[r].Shape
		feeds[r] = map[string]*tf.Tensor{"loss": shapedTensor(t, toFloat32s(perExample[r]), shape)}
		if c.weight != nil {
			feeds[r]["w"] = shapedTensor(t, c.Weights[r].Values.([]float32), c.Weights[r].Shape)
		}
	}
	res, err := e.RunReplicas(context.Background(), step, feeds, c.examples)
	require.NoError(t, err)
	return res
}

func toFloat32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// shaped returns the tensor of values with the given shape.
func shapedTensor(t *testing.T, values []float32, shape []int64) *tf.Tensor {
	t.Helper()
	if len(shape) == 0 {
		x, err := tf.NewTensor(values[0])
		require.NoError(t, err)
		return x
	}
	x, err := tf.NewTensor(values)
	require.NoError(t, err)
	require.NoError(t, x.Reshape(shape))
	return x
}

// assertNear asserts |want - got| <= 1e-6, relative to |want| above 1.
func assertLossNear(t *testing.T, want, got float64, msgAndArgs ...any) {
	t.Helper()
	assert.InDelta(t, want, got, 1e-6*max(1, math.Abs(want)), msgAndArgs...)
}

// ComputeAverageLoss and every ReduceLoss reduction give, under Mirrored
// on two CPUs, the losses that tf.nn.compute_average_loss and Keras 3's
// SparseCategoricalCrossentropy with each reduction give under
// tf.distribute.MirroredStrategy on two logical CPUs, summed over the
// replicas (what the summed gradients are the gradient of), to 1e-6:
// per-example, per-token [b, T] and flattened per-token losses, with and
// without sample weights, for replicas with equal batches and with a
// partial one. Replica.AverageLoss of an unweighted per-example loss is
// compute_average_loss with the global batch's examples as
// global_batch_size.
func TestLossReductionsMatchTensorFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the comparison with Python TensorFlow, which installs it")
	}
	var cases []lossCase
	for _, batches := range [][]int{{3, 3}, {4, 2}} {
		cases = append(cases, lossCases(batches)...)
	}
	var want map[string]lossAnswer
	pyenv.TensorFlow(t).JSON(t, filepath.Join("testdata", "keras_losses.py"), map[string]any{"cases": cases}, &want)

	s, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer s.Close()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			w, ok := want[c.Name]
			require.True(t, ok, "the script answered no case %q", c.Name)
			res := runLossCase(t, s, c, w.PerExample)
			got := func(name string) float64 { return float64(res.Reduced(name).Value().(float32)) }
			assertLossNear(t, w.AverageLoss, got("compute_average_loss"), "compute_average_loss")
			assertLossNear(t, w.AverageLossGlobal, got("compute_average_loss_global"), "compute_average_loss global_batch_size=%d", c.GlobalBatchSize)
			if c.weight == nil && c.perExample == nil {
				assertLossNear(t, w.AverageLossGlobal, got("average_loss"), "AverageLoss")
			}
			if !c.Keras {
				return
			}
			assertLossNear(t, w.SumOverBatchSize, got("sum_over_batch_size"), "Keras sum_over_batch_size")
			assertLossNear(t, w.Sum, got("sum"), "Keras sum")
			for r, none := range res["none"] {
				vals := tensorutil.Float32s(none)
				require.Len(t, vals, len(w.None[r]), "replica %d: none", r)
				for i := range vals {
					assertLossNear(t, w.None[r][i], float64(vals[i]), "replica %d: none[%d]", r, i)
				}
			}
		})
	}
}

// tokenLoss is a per-token loss of 4 sequences of 3 tokens, and its mean.
var tokenLoss = [][]float32{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}

const tokenMean = 6.5

// tokenStep returns, for a per-token loss fed as "loss" [b, T], the loss
// as ComputeAverageLoss of the flattened loss, ReduceLoss with
// SumOverBatchSize of the loss [b, T] and AverageLoss of the flattened
// loss, each summed over the replicas in sync.
func tokenStep(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
	b := nn.NewBuilder(r.Scope(), "tokens")
	flat := b.Reshape(in["loss"], -1)
	cal, err := nn.ComputeAverageLoss(r, flat)
	if err != nil {
		return nil, err
	}
	sobs, err := nn.ReduceLoss(r, in["loss"], nn.SumOverBatchSize)
	if err != nil {
		return nil, err
	}
	out := map[string]tf.Output{"compute_average_loss": cal, "sum_over_batch_size": sobs, "average_loss": r.AverageLoss(flat)}
	for name, v := range out {
		if err := r.ReduceOutput(name, strategy.Sum, v); err != nil {
			return nil, err
		}
	}
	return nil, b.Err()
}

var tokenSpec = strategy.InputSpec{"loss": {DType: tf.Float, Shape: []int64{-1, 3}}}

// A per-token loss gives the mean per token — as ComputeAverageLoss of
// the flattened loss and as ReduceLoss with SumOverBatchSize of [b, T] —
// on the default strategy, on Mirrored ×2 and on a parameter-server
// worker, whose update is its own although two workers run; AverageLoss of
// the flattened loss, which divides by the examples, is T times larger.
func TestPerTokenLossIsTheMeanPerToken(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	two, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	defer two.Close()
	for name, e := range map[string]stepEngine{"default": def, "mirrored_x2": two} {
		t.Run(name, func(t *testing.T) {
			step, err := e.Build(tokenSpec, tokenStep)
			require.NoError(t, err)
			n := e.NumLocalReplicas()
			feeds := make([]map[string]*tf.Tensor, n)
			for r := range n {
				x, err := tf.NewTensor(tokenLoss[r*len(tokenLoss)/n : (r+1)*len(tokenLoss)/n])
				require.NoError(t, err)
				feeds[r] = map[string]*tf.Tensor{"loss": x}
			}
			res, err := e.RunReplicas(context.Background(), step, feeds, len(tokenLoss))
			require.NoError(t, err)
			assertTokenMeans(t, map[string]*tf.Tensor{"compute_average_loss": res.Reduced("compute_average_loss"),
				"sum_over_batch_size": res.Reduced("sum_over_batch_size"), "average_loss": res.Reduced("average_loss")})
		})
	}
	t.Run("paramserver_2_workers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s := testcluster.ParameterServers(t, ctx, 2, 1)
		defer s.Close()
		fn, err := s.Build(tokenSpec, tokenStep)
		require.NoError(t, err)
		c, err := paramserver.NewCoordinator(s)
		require.NoError(t, err)
		defer c.Done(ctx)
		x, err := tf.NewTensor(tokenLoss)
		require.NoError(t, err)
		rv, err := c.Schedule(fn, paramserver.Feed(dataset.Element{"loss": x}))
		require.NoError(t, err)
		out, err := rv.Get(ctx)
		require.NoError(t, err)
		assertTokenMeans(t, out)
	})
}

func assertTokenMeans(t *testing.T, out map[string]*tf.Tensor) {
	t.Helper()
	for name, want := range map[string]float64{"compute_average_loss": tokenMean, "sum_over_batch_size": tokenMean, "average_loss": 3 * tokenMean} {
		require.NotNil(t, out[name], name)
		assert.InDelta(t, want, out[name].Value().(float32), 1e-6, name)
	}
}

// A loss or option the reductions cannot take is a build error naming it
// and what was expected.
func TestLossBadInput(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	spec := strategy.InputSpec{"loss": {DType: tf.Float, Shape: []int64{-1, 3}}, "ids": {DType: tf.Int32, Shape: []int64{-1}},
		"w": {DType: tf.Float, Shape: []int64{-1, 2}}, "w3": {DType: tf.Float, Shape: []int64{-1, 3, 2}}}
	for _, c := range []struct {
		name string
		fn   func(r strategy.Replica, in strategy.Inputs) (tf.Output, error)
		want string
	}{
		{"scalar", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ComputeAverageLoss(r, nn.NewBuilder(r.Scope(), "x").SumAll(in["loss"]))
		}, "nn.ComputeAverageLoss: perExample is a scalar; expected rank 1 or more"},
		{"integer", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ComputeAverageLoss(r, in["ids"])
		}, "nn.ComputeAverageLoss: the loss is int32; expected float16, bfloat16, float32 or float64"},
		{"negative global batch", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ComputeAverageLoss(r, in["loss"], nn.GlobalBatchSize(-2))
		}, "nn.ComputeAverageLoss: GlobalBatchSize(-2): expected 0 or more examples"},
		{"weights that do not broadcast", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ComputeAverageLoss(r, in["loss"], nn.SampleWeight(in["w"]))
		}, "nn.ComputeAverageLoss: SampleWeight of shape [?, 2] with perExample of shape [?, 3]: expected shapes that broadcast"},
		{"weights whose last axis does not squeeze", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ComputeAverageLoss(r, in["loss"], nn.SampleWeight(in["w3"]))
		}, "nn.ComputeAverageLoss: SampleWeight of shape [?, 3, 2] with perExample of shape [?, 3]: expected shapes that broadcast"},
		{"zero loss", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ReduceLoss(r, tf.Output{}, nn.Sum)
		}, "nn.ReduceLoss: the loss is a zero tf.Output"},
		{"unknown reduction", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ReduceLoss(r, in["loss"], nn.Reduction(7))
		}, "nn.ReduceLoss: reduction Reduction(7): expected SumOverBatchSize, Sum or None"},
		{"global batch size", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ReduceLoss(r, in["loss"], nn.SumOverBatchSize, nn.GlobalBatchSize(8))
		}, "nn.ReduceLoss: GlobalBatchSize(8): a Keras reduction divides by the loss's own size"},
		{"keras weights that do not broadcast", func(r strategy.Replica, in strategy.Inputs) (tf.Output, error) {
			return nn.ReduceLoss(r, in["loss"], nn.Sum, nn.SampleWeight(in["w"]))
		}, "nn.ReduceLoss sum: SampleWeight of shape [?, 2] with values of shape [?, 3]: expected shapes that broadcast"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				loss, err := c.fn(r, in)
				return strategy.Outputs{"loss": loss}, err
			})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
