package nn_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// jsonTensor is a tensor as the Keras scripts read it.
type jsonTensor struct {
	Shape  []int64   `json:"shape"`
	Values []float64 `json:"values"`
	DType  string    `json:"dtype,omitempty"`
}

// randomTensor returns a tensor of shape with values uniform in
// [-scale, scale).
func randomTensor(rng *rand.Rand, scale float64, shape ...int64) jsonTensor {
	t := jsonTensor{Shape: shape, Values: make([]float64, shapeSize(shape))}
	for i := range t.Values {
		t.Values[i] = float64(float32(scale * (2*rng.Float64() - 1)))
	}
	return t
}

// shapeSize returns the number of elements of a tensor of shape.
func shapeSize(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// tensor returns t as a float32, or bool, TensorFlow tensor.
func (t jsonTensor) tensor() (*tf.Tensor, error) {
	var x *tf.Tensor
	var err error
	if t.DType == "bool" {
		b := make([]bool, len(t.Values))
		for i, v := range t.Values {
			b[i] = v != 0
		}
		x, err = tf.NewTensor(b)
	} else {
		f := make([]float32, len(t.Values))
		for i, v := range t.Values {
			f[i] = float32(v)
		}
		x, err = tf.NewTensor(f)
	}
	if err != nil {
		return nil, err
	}
	return x, x.Reshape(t.Shape)
}

// mhaCase is a MultiHeadAttention called on named tensors, with the
// keras.layers.MultiHeadAttention arguments that describe the same layer.
type mhaCase struct {
	Name        string                `json:"name"`
	Config      map[string]any        `json:"config"`
	Causal      bool                  `json:"causal"`
	Tensors     map[string]jsonTensor `json:"tensors"`
	Query       string                `json:"query"`
	Value       string                `json:"value"`
	Key         string                `json:"key,omitempty"`
	Mask        *jsonTensor           `json:"mask,omitempty"`
	Weights     map[string]jsonTensor `json:"weights"`
	LossWeights jsonTensor            `json:"loss_weights"`

	spec   nn.MultiHeadAttention
	policy nn.Policy
	tol    float64
}

// mhaResult is a layer's output and the gradients of sum(output ·
// loss_weights) by tensor or weight name.
type mhaResult struct {
	Output []float64            `json:"output"`
	Grads  map[string][]float64 `json:"grads"`
}

// newMHACase returns a case of spec on tensors of the given shapes (query
// and value named q and v, or both x when value is nil; key k when
// given), with random values; mask, if not nil, is the attention mask.
func newMHACase(name string, rng *rand.Rand, spec nn.MultiHeadAttention, query, value, key []int64, mask *jsonTensor) *mhaCase {
	c := &mhaCase{Name: name, spec: spec, Causal: spec.UseCausalMask, Tensors: map[string]jsonTensor{}, Mask: mask, tol: 1e-5}
	c.Query, c.Value = "q", "v"
	if value == nil {
		c.Query, c.Value, value = "x", "x", query
	}
	c.Tensors[c.Query] = randomTensor(rng, 1, query...)
	c.Tensors[c.Value] = randomTensor(rng, 1, value...)
	if key != nil {
		c.Key = "k"
		c.Tensors["k"] = randomTensor(rng, 1, key...)
	}
	keyDim := spec.KeyDim
	if keyDim == 0 {
		keyDim = int(query[2]) / spec.NumHeads
	}
	c.Config = map[string]any{"num_heads": spec.NumHeads, "key_dim": keyDim, "value_dim": nil, "use_bias": !spec.NoBias, "output_shape": nil}
	out := query[2]
	if spec.ValueDim > 0 {
		c.Config["value_dim"] = spec.ValueDim
	}
	if spec.OutputShape > 0 {
		c.Config["output_shape"] = spec.OutputShape
		out = int64(spec.OutputShape)
	}
	c.LossWeights = randomTensor(rng, 1, query[0], query[1], out)
	return c
}

// mixed returns c computing under p, compared to Keras' dtype policy p
// within tol.
func (c *mhaCase) mixed(p nn.Policy, tol float64) *mhaCase {
	c.policy, c.tol, c.Config["dtype"] = p, tol, p.Name()
	return c
}

// tensorNames returns the case's tensor names in order.
func (c *mhaCase) tensorNames() []string {
	names := make([]string, 0, len(c.Tensors))
	for n := range c.Tensors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// build creates the tensors as variables (so that the gradients reach
// them) and the model of the one layer called on them.
func (c *mhaCase) build(sc strategy.Scope) (*nn.Model, []strategy.Variable, error) {
	var vars []strategy.Variable
	inputs := map[string]*nn.Tensor{}
	var ins []*nn.Tensor
	for _, n := range c.tensorNames() {
		x, err := c.Tensors[n].tensor()
		if err != nil {
			return nil, nil, err
		}
		v, err := sc.Variable("inputs/"+n, tf.Float, x.Shape(), func(s *op.Scope, _ tf.DataType, _ []int64) (tf.Output, error) {
			return op.Const(s, x), s.Err()
		})
		if err != nil {
			return nil, nil, err
		}
		vars = append(vars, v)
		inputs[n] = nn.Input(x.Shape()[1:]...).Named(n)
		ins = append(ins, inputs[n])
	}
	var mask *nn.Tensor
	if c.Mask != nil {
		dt := tf.Float
		if c.Mask.DType == "bool" {
			dt = tf.Bool
		}
		mask = nn.InputOf(dt, c.Mask.Shape[1:]...).Named("mask")
		ins = append(ins, mask)
	}
	y := c.spec.CallMasked(inputs[c.Query], inputs[c.Value], inputs[c.Key], mask)
	m, err := nn.NewModel(sc, "m", ins, []*nn.Tensor{y})
	return m, vars, err
}

// setWeights gives the layer's variables random values, recorded in
// c.Weights under Keras' names.
func (c *mhaCase) setWeights(t *testing.T, s *onedevice.Strategy, m *nn.Model, rng *rand.Rand) {
	c.Weights = map[string]jsonTensor{}
	for _, v := range m.Vars() {
		w := randomTensor(rng, 0.5, v.Shape()...)
		x, err := w.tensor()
		require.NoError(t, err)
		require.NoError(t, s.Assign(context.Background(), v, x))
		c.Weights[strings.TrimPrefix(v.Name(), mhaPrefix)] = w
	}
}

// mhaPrefix is the prefix of the layer's variables' names.
const mhaPrefix = "m/multi_head_attention_0/"

// run computes the case's output and gradients with tfdist.
func (c *mhaCase) run(t *testing.T) mhaResult {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Model
	var inVars []strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, inVars, err = c.build(sc)
		return err
	}))
	c.setWeights(t, s, m, rand.New(rand.NewPCG(7, uint64(len(c.Name)))))
	feeds := map[string]*tf.Tensor{}
	feeds["lw"], err = c.LossWeights.tensor()
	require.NoError(t, err)
	spec := strategy.InputSpec{"lw": {DType: tf.Float, Shape: c.LossWeights.Shape}}
	if c.Mask != nil {
		feeds["mask"], err = c.Mask.tensor()
		require.NoError(t, err)
		spec["mask"] = strategy.TensorSpec{DType: feeds["mask"].DataType(), Shape: c.Mask.Shape}
	}
	step, err := s.Build(spec, c.step(m, inVars))
	require.NoError(t, err)
	res, err := s.RunReplicas(context.Background(), step, []map[string]*tf.Tensor{feeds}, int(c.LossWeights.Shape[0]))
	require.NoError(t, err)
	got := mhaResult{Output: tensorFloat64s(res["y"][0]), Grads: map[string][]float64{}}
	names := c.tensorNames()
	for _, v := range m.Vars() {
		names = append(names, strings.TrimPrefix(v.Name(), mhaPrefix))
	}
	for i, n := range names {
		got.Grads[n] = tensorFloat64s(res[fmt.Sprintf("grad_%d", i)][0])
	}
	return got
}

// step returns the replica function that outputs the model's output y
// on the tensors' variables and the gradients grad_i of sum(y · lw) with
// respect to the variables and then the model's weights.
func (c *mhaCase) step(m *nn.Model, inVars []strategy.Variable) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		xs, err := readVars(r, inVars)
		if err != nil {
			return nil, err
		}
		if c.Mask != nil {
			xs = append(xs, in["mask"])
		}
		ys, err := m.WithPolicy(c.policy).Outputs(r, xs, false)
		if err != nil {
			return nil, err
		}
		b := nn.NewBuilder(r.Scope(), "loss")
		grads, err := r.Gradients(b.SumAll(b.Mul(ys[0], in["lw"])), append(slices.Clone(inVars), m.Vars()...))
		out := strategy.Outputs{"y": ys[0]}
		for i, g := range grads {
			out[fmt.Sprintf("grad_%d", i)] = g
		}
		return out, err
	}
}

func readVars(r strategy.Replica, vs []strategy.Variable) ([]tf.Output, error) {
	out := make([]tf.Output, len(vs))
	for i, v := range vs {
		var err error
		if out[i], err = r.Read(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func tensorFloat64s(t *tf.Tensor) []float64 {
	f := tensorutil.Float32s(t)
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// closeness returns the largest |got-want| / max(1, |want|) and where.
func closeness(got, want []float64) (float64, int) {
	if len(got) != len(want) {
		return math.Inf(1), -1
	}
	worst, at := 0.0, -1
	for i := range got {
		if d := math.Abs(got[i]-want[i]) / math.Max(1, math.Abs(want[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	return worst, at
}

// maskTensor returns a mask [batch, tq, tv] of dtype ("bool", or "" for
// float32) that is 1 where admit says.
func maskTensor(dtype string, batch, tq, tv int, admit func(b, i, j int) bool) *jsonTensor {
	m := &jsonTensor{Shape: []int64{int64(batch), int64(tq), int64(tv)}, DType: dtype}
	for b := range batch {
		for i := range tq {
			for j := range tv {
				m.Values = append(m.Values, 0)
				if admit(b, i, j) {
					m.Values[len(m.Values)-1] = 1
				}
			}
		}
	}
	return m
}

// weightScale describes a weight's values.
type weightScale struct {
	Std    float64 `json:"std"`
	MaxAbs float64 `json:"max_abs"`
}

// mhaCases are the layers compared with Keras.
func mhaCases() []*mhaCase {
	rng := rand.New(rand.NewPCG(1, 2))
	mha := func(heads, keyDim int) nn.MultiHeadAttention {
		return nn.MultiHeadAttention{NumHeads: heads, KeyDim: keyDim}
	}
	causal := mha(2, 4)
	causal.UseCausalMask = true
	// Batch 0 admits every key position but the last; batch 1 only the
	// first four, and its query position 1 none.
	padding := maskTensor("bool", 2, 3, 6, func(b, i, j int) bool { return j < 5 && b == 0 || j < 4 && b == 1 && i != 1 })
	// A float mask over self-attention of 5 positions, which with the
	// causal mask leaves query position 0 of batch 1 no key.
	numbers := maskTensor("", 2, 5, 5, func(b, _, j int) bool { return !(b == 1 && j == 0) && j != 3 })
	noBias := mha(2, 4)
	noBias.NoBias = true
	crossDims := nn.MultiHeadAttention{NumHeads: 3, KeyDim: 4, ValueDim: 2, OutputShape: 7}
	causalMasked := causal
	causalMasked.NumHeads, causalMasked.KeyDim = 4, 0
	mixed := causal
	return []*mhaCase{
		newMHACase("self_attention", rng, mha(2, 4), []int64{2, 5, 8}, nil, nil, nil),
		newMHACase("causal", rng, causal, []int64{2, 5, 8}, nil, nil, nil),
		newMHACase("cross_padding_mask", rng, mha(2, 3), []int64{2, 3, 8}, []int64{2, 6, 5}, nil, padding),
		newMHACase("cross_key_value_dim_output_shape", rng, crossDims, []int64{2, 3, 8}, []int64{2, 6, 6}, []int64{2, 6, 5}, nil),
		newMHACase("no_bias", rng, noBias, []int64{2, 4, 6}, []int64{2, 5, 6}, nil, nil),
		newMHACase("causal_and_float_mask_key_dim_from_width", rng, causalMasked, []int64{2, 5, 8}, nil, nil, numbers),
		newMHACase("causal_cross", rng, causal, []int64{2, 3, 8}, []int64{2, 6, 5}, []int64{2, 6, 4}, nil),
		newMHACase("mixed_bfloat16_float_mask", rng, mixed, []int64{2, 5, 8}, nil, nil, numbers).mixed(nn.MixedBfloat16, 3e-2),
		newMHACase("mixed_float16_bool_mask", rng, mha(2, 3), []int64{2, 3, 8}, []int64{2, 6, 5}, nil, padding).mixed(nn.MixedFloat16, 1e-2),
	}
}

// tfdist's MultiHeadAttention and Keras 3's layers.MultiHeadAttention, on
// the same weights and inputs, give the same outputs and the same
// gradients with respect to every input and weight, within 1e-5 (of the
// value, or absolute below 1): self-attention, the causal mask, padding
// and float masks combined with it (a query position left no key
// included), cross-attention with a separate key, ValueDim, OutputShape,
// no bias, and under mixed_bfloat16 and mixed_float16 (within their
// rounding). Keras' default initializers and tfdist's give kernels of one
// scale, which fixes the fans of Glorot's rule.
//
// The Keras side runs in the cached Python environment (internal/pyenv).
func TestMultiHeadAttentionMatchesKeras(t *testing.T) {
	cases := mhaCases()
	got := map[string]mhaResult{}
	for _, c := range cases {
		got[c.Name] = c.run(t)
	}
	initCfg := map[string]any{"num_heads": 4, "key_dim": 16, "value_dim": 8, "output_shape": 48}
	initReq := []map[string]any{{"name": "init", "config": initCfg, "query": []int64{2, 3, 64}, "value": []int64{2, 5, 32}}}
	var want struct {
		Cases map[string]mhaResult              `json:"cases"`
		Init  map[string]map[string]weightScale `json:"init"`
	}
	pyenv.TensorFlow(t).JSON(t, filepath.Join("testdata", "keras_attention.py"),
		map[string]any{"cases": cases, "init": initReq}, &want)
	for _, c := range cases {
		w, g := want.Cases[c.Name], got[c.Name]
		d, at := closeness(g.Output, w.Output)
		assert.LessOrEqual(t, d, c.tol, "%s: output[%d]", c.Name, at)
		require.Len(t, g.Grads, len(w.Grads), "%s: gradients of %d tensors and weights, Keras' of %d", c.Name, len(g.Grads), len(w.Grads))
		worst, worstName := 0.0, ""
		for n, wg := range w.Grads {
			dg, at := closeness(g.Grads[n], wg)
			assert.LessOrEqual(t, dg, c.tol, "%s: gradient of %s[%d]", c.Name, n, at)
			if dg >= worst {
				worst, worstName = dg, n
			}
		}
		t.Logf("%s: output within %.2g of Keras', gradients within %.2g (%s)", c.Name, d, worst, worstName)
	}
	checkInitScale(t, want.Init["init"])
}

// checkInitScale checks that a layer of the init request's configuration
// starts with kernels of the scale of Keras', want, and zero biases.
func checkInitScale(t *testing.T, want map[string]weightScale) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		q, v := nn.Input(3, 64), nn.Input(5, 32)
		y := nn.MultiHeadAttention{NumHeads: 4, KeyDim: 16, ValueDim: 8, OutputShape: 48}.Call(q, v)
		m, err = nn.NewModel(sc, "m", []*nn.Tensor{q, v}, []*nn.Tensor{y}, nn.WithSeed(3))
		return err
	}))
	got := values(t, s, m.Vars())
	require.Len(t, got, len(want))
	for name, w := range want {
		vals := got[mhaPrefix+name]
		require.NotEmpty(t, vals, name)
		var sum, sq, maxAbs float64
		for _, x := range vals {
			sum, sq, maxAbs = sum+float64(x), sq+float64(x)*float64(x), math.Max(maxAbs, math.Abs(float64(x)))
		}
		n := float64(len(vals))
		std := math.Sqrt(sq/n - (sum/n)*(sum/n))
		if strings.HasSuffix(name, "bias") {
			assert.Zero(t, maxAbs, name)
			assert.Zero(t, w.MaxAbs, "Keras' %s", name)
			continue
		}
		t.Logf("%s: std %.4f, Keras' %.4f; max |w| %.4f, Keras' %.4f", name, std, w.Std, maxAbs, w.MaxAbs)
		assert.InEpsilon(t, w.Std, std, 0.1, "%s: std", name)
		assert.InEpsilon(t, w.MaxAbs, maxAbs, 0.1, "%s: largest |w|", name)
	}
}

// runAttention builds model on a strategy of its own and returns its
// outputs on each of xs, in inference and, when training, in training
// too.
func runAttention(t *testing.T, build func(sc strategy.Scope) (*nn.Model, error), training bool, xs ...[][][]float32) [][]float32 {
	t.Helper()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		m, err = build(sc)
		return err
	}))
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, int64(len(xs[0][0])), int64(len(xs[0][0][0]))}}}
	step, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		y, err := m.Apply(r, in["x"], training)
		return strategy.Outputs{"y": y}, err
	})
	require.NoError(t, err)
	var out [][]float32
	for _, x := range xs {
		xt, err := tf.NewTensor(x)
		require.NoError(t, err)
		res, err := s.RunReplicas(context.Background(), step, []map[string]*tf.Tensor{{"x": xt}}, len(x))
		require.NoError(t, err)
		out = append(out, tensorutil.Float32s(res["y"][0]))
	}
	return out
}

// selfAttention returns a model of one causal self-attention layer on
// sequences of the given length and width.
func selfAttention(spec nn.MultiHeadAttention, length, width int64) func(sc strategy.Scope) (*nn.Model, error) {
	return func(sc strategy.Scope) (*nn.Model, error) {
		x := nn.Input(length, width)
		return nn.NewModel(sc, "m", []*nn.Tensor{x}, []*nn.Tensor{spec.Call(x, x)}, nn.WithSeed(5))
	}
}

// sequences returns a batch of n sequences of length positions of width
// features.
func sequences(n, length, width int, seed uint64) [][][]float32 {
	rng := rand.New(rand.NewPCG(seed, 9))
	x := make([][][]float32, n)
	for i := range x {
		x[i] = make([][]float32, length)
		for j := range x[i] {
			x[i][j] = make([]float32, width)
			for k := range x[i][j] {
				x[i][j][k] = float32(2*rng.Float64() - 1)
			}
		}
	}
	return x
}

// Under the causal mask, changing the input at position 3 leaves the
// outputs at positions 0 to 2 exactly as they were and changes those
// from 3 on; without it, every position changes.
func TestMultiHeadAttentionCausalMask(t *testing.T) {
	const length, width = 6, 8
	x := sequences(2, length, width, 1)
	changed := sequences(2, length, width, 1)
	for i := range changed {
		for k := range changed[i][3] {
			changed[i][3][k] += 0.5
		}
	}
	for _, causal := range []bool{true, false} {
		spec := nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4, UseCausalMask: causal}
		ys := runAttention(t, selfAttention(spec, length, width), false, x, changed)
		for i := range x {
			for p := range length {
				at := (i*length + p) * width
				before, after := ys[0][at:at+width], ys[1][at:at+width]
				if causal && p < 3 {
					assert.Equal(t, before, after, "causal: example %d, position %d", i, p)
				} else {
					assert.Greater(t, maxDiff(before, after), 1e-4, "causal %v: example %d, position %d", causal, i, p)
				}
			}
		}
	}
}

// With Dropout, training drops attention probabilities — outputs differ
// from inference's — from masks that repeat on a new strategy with the
// same seed; inference is unaffected.
func TestMultiHeadAttentionDropout(t *testing.T) {
	x := sequences(2, 5, 8, 2)
	build := selfAttention(nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4, Dropout: 0.5}, 5, 8)
	plain := selfAttention(nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4}, 5, 8)
	first := runAttention(t, build, true, x, x)
	again := runAttention(t, build, true, x, x)
	assert.Equal(t, first, again, "the same seed and steps give the same masks")
	assert.Greater(t, maxDiff(first[0], first[1]), 1e-4, "each step draws new masks")
	inference := runAttention(t, build, false, x)
	assert.Equal(t, runAttention(t, plain, false, x), inference, "inference does not drop")
	assert.Greater(t, maxDiff(first[0], inference[0]), 1e-4, "training drops")
}

// A MultiHeadAttention that does not fit its inputs is an error naming
// the layer, the shapes and what it expected, when the model is built.
func TestMultiHeadAttentionBuildErrors(t *testing.T) {
	mha := nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4}
	seq := func(shape ...int64) *nn.Tensor { return nn.Input(shape...) }
	for _, c := range []struct {
		name string
		ins  []*nn.Tensor
		call func(ins []*nn.Tensor) *nn.Tensor
		want string
	}{
		{"query of rank 2", []*nn.Tensor{seq(8), seq(5, 8)}, func(x []*nn.Tensor) *nn.Tensor { return mha.Call(x[0], x[1]) },
			"layer m/multi_head_attention_0: MultiHeadAttention: query shape [-1 8], expected [batch, time, features]"},
		{"value of rank 4", []*nn.Tensor{seq(5, 8), seq(5, 2, 8)}, func(x []*nn.Tensor) *nn.Tensor { return mha.Call(x[0], x[1]) },
			"value shape [-1 5 2 8], expected [batch, time, features]"},
		{"key of rank 2", []*nn.Tensor{seq(5, 8), seq(5, 8), seq(8)}, func(x []*nn.Tensor) *nn.Tensor { return mha.CallMasked(x[0], x[1], x[2], nil) },
			"key shape [-1 8], expected [batch, time, features]"},
		{"key and value of different lengths", []*nn.Tensor{seq(5, 8), seq(6, 8), seq(7, 8)},
			func(x []*nn.Tensor) *nn.Tensor { return mha.CallMasked(x[0], x[1], x[2], nil) },
			"key shape [-1 7 8] and value shape [-1 6 8], expected one length"},
		{"mask of the wrong shape", []*nn.Tensor{seq(5, 8), seq(6, 8), nn.InputOf(tf.Bool, 6, 5)},
			func(x []*nn.Tensor) *nn.Tensor { return mha.CallMasked(x[0], x[1], nil, x[2]) },
			"mask shape [-1 6 5], expected [batch, query length, value length] = [-1 5 6]"},
		{"mask of rank 2", []*nn.Tensor{seq(5, 8), nn.InputOf(tf.Bool, 5)},
			func(x []*nn.Tensor) *nn.Tensor { return mha.CallMasked(x[0], x[0], nil, x[1]) },
			"mask shape [-1 5], expected [batch, query length, value length] = [-1 5 5]"},
		{"no heads", []*nn.Tensor{seq(5, 8)}, func(x []*nn.Tensor) *nn.Tensor { return nn.MultiHeadAttention{KeyDim: 4}.Call(x[0], x[0]) },
			"MultiHeadAttention: NumHeads 0, expected at least 1"},
		{"negative KeyDim", []*nn.Tensor{seq(5, 8)}, func(x []*nn.Tensor) *nn.Tensor {
			return nn.MultiHeadAttention{NumHeads: 2, KeyDim: -1}.Call(x[0], x[0])
		}, "KeyDim -1, expected at least 1, or 0 for the query's width over NumHeads"},
		{"heads not dividing the width", []*nn.Tensor{seq(5, 10)}, func(x []*nn.Tensor) *nn.Tensor {
			return nn.MultiHeadAttention{NumHeads: 4}.Call(x[0], x[0])
		}, "NumHeads 4 does not divide the query's width 10 (query shape [-1 5 10]); give KeyDim or a NumHeads that divides it"},
		{"dropout rate 1", []*nn.Tensor{seq(5, 8)}, func(x []*nn.Tensor) *nn.Tensor {
			return nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4, Dropout: 1}.Call(x[0], x[0])
		}, "Dropout 1, expected 0 <= Dropout < 1"},
		{"unknown width", []*nn.Tensor{seq(5, -1)}, func(x []*nn.Tensor) *nn.Tensor { return mha.Call(x[0], x[0]) },
			"query shape [-1 5 -1], expected [batch, time, features] with features known"},
	} {
		s, err := onedevice.New()
		require.NoError(t, err)
		err = s.Scope(func(sc strategy.Scope) error {
			_, err := nn.NewModel(sc, "m", c.ins, []*nn.Tensor{c.call(c.ins)})
			return err
		})
		assert.ErrorContains(t, err, c.want, c.name)
		require.NoError(t, s.Close())
	}
}
