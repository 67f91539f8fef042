package nn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// This file compares tfdist's layers with Keras 3's on TensorFlow 2.18
// (testdata/keras_layers.py): for each case, one layer built in a model of
// its own under the default strategy, and the Keras layer given the same
// weights and inputs, must agree on the forward output, on the gradients
// of sum(output·c), c a fixed random tensor, with respect to every float
// input and every trainable weight, and on every weight after the call
// (BatchNorm's moving statistics).
//
// To add a case, append to kerasLayerCases a kerasLayerCase: the name, our
// spec, the Keras class and its constructor's arguments, and the inputs
// (f32(shape…) or ids32(n, shape…), batch first). Our layer must create
// its trainable variables in the order of Keras' layer.trainable_weights,
// then its others in the order of layer.non_trainable_weights; a weight
// whose shape differs from Keras' but holds its elements in the same
// order (a kernel [d, heads·k] for Keras' [d, heads, k]) is reshaped. A
// layer of several inputs gets them as a list (the merge layers) or, with
// call "args", as positional arguments (MultiHeadAttention's query,
// value, key); kwargs are further arguments of the Keras call
// (use_causal_mask). A Keras layer that keras.layers lacks is defined in
// the script.

// kerasLayerCase is one layer compared with Keras.
type kerasLayerCase struct {
	name     string
	spec     nn.AnySpec
	keras    string         // a keras.layers class, or one the script defines
	config   map[string]any // its constructor's keyword arguments
	in       []kerasInput
	training bool
	call     string         // "args": several inputs as positional arguments
	kwargs   map[string]any // further keyword arguments of the Keras call
	// noInputGrads is set for a layer whose output does not depend on its
	// inputs' values (PositionEmbedding).
	noInputGrads bool
	// anyLength declares the model's inputs with axis 1 (the steps) of
	// any size, so that the layer computes shapes at run time.
	anyLength bool
	// policy, when mixed, runs our model under it and the Keras layer
	// with it as its dtype; tol then bounds the differences (default
	// 1e-5).
	policy nn.Policy
	tol    float64
}

// kerasInput is one input of a case: float32 values in [-2, 2), or int32
// ids in [0, ids) when ids > 0.
type kerasInput struct {
	shape []int64
	ids   int
}

func f32(shape ...int64) kerasInput          { return kerasInput{shape: shape} }
func ids32(n int, shape ...int64) kerasInput { return kerasInput{shape: shape, ids: n} }
func ins(in ...kerasInput) []kerasInput      { return in }

// kw returns the keyword arguments key, value, key, value, ….
func kw(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func kerasLayerCases() []kerasLayerCase {
	var cases []kerasLayerCase
	acts := []nn.Activation{nn.Linear, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.GELUTanh, nn.SiLU, nn.Softmax}
	for _, a := range acts {
		cases = append(cases,
			kerasLayerCase{name: "dense_rank2_" + a.String(), spec: nn.Dense{Units: 4, Activation: a},
				keras: "Dense", config: kw("units", 4, "activation", a.String()), in: ins(f32(3, 5))},
			kerasLayerCase{name: "dense_rank3_" + a.String(), spec: nn.Dense{Units: 4, Activation: a},
				keras: "Dense", config: kw("units", 4, "activation", a.String()), in: ins(f32(2, 3, 5))},
			kerasLayerCase{name: "activation_" + a.String(), spec: nn.ActivationLayer{Activation: a},
				keras: "Activation", config: kw("activation", a.String()), in: ins(f32(2, 3, 4))})
	}
	return append(cases, []kerasLayerCase{
		{name: "dense_rank3_any_length", spec: nn.Dense{Units: 3}, keras: "Dense", config: kw("units", 3), in: ins(f32(2, 4, 5)), anyLength: true},
		{name: "dense_rank4", spec: nn.Dense{Units: 3}, keras: "Dense", config: kw("units", 3), in: ins(f32(2, 2, 3, 4))},
		{name: "dense_no_bias", spec: nn.Dense{Units: 3, NoBias: true}, keras: "Dense", config: kw("units", 3, "use_bias", false), in: ins(f32(2, 4, 5))},
		{name: "softmax", spec: nn.Softmax, keras: "Softmax", in: ins(f32(2, 3, 5))},
		{name: "conv2d_valid", spec: nn.Conv2D{Filters: 3, Kernel: 3}, keras: "Conv2D",
			config: kw("filters", 3, "kernel_size", 3), in: ins(f32(2, 6, 5, 2))},
		{name: "conv2d_same_no_bias", spec: nn.Conv2D{Filters: 3, Kernel: 3, Padding: nn.Same, NoBias: true}, keras: "Conv2D",
			config: kw("filters", 3, "kernel_size", 3, "padding", "same", "use_bias", false), in: ins(f32(2, 5, 5, 2))},
		{name: "conv2d_same_strides2_relu", spec: nn.Conv2D{Filters: 4, Kernel: 3, Strides: 2, Padding: nn.Same, Activation: nn.ReLU}, keras: "Conv2D",
			config: kw("filters", 4, "kernel_size", 3, "strides", 2, "padding", "same", "activation", "relu"), in: ins(f32(2, 7, 6, 3))},
		{name: "conv2d_valid_strides2_gelu", spec: nn.Conv2D{Filters: 2, Kernel: 2, Strides: 2, Activation: nn.GELU}, keras: "Conv2D",
			config: kw("filters", 2, "kernel_size", 2, "strides", 2, "activation", "gelu"), in: ins(f32(2, 5, 5, 3))},
		{name: "layer_norm_last", spec: nn.LayerNorm{}, keras: "LayerNormalization", in: ins(f32(3, 4, 6))},
		{name: "layer_norm_axis1", spec: nn.LayerNorm{Axis: 1, Epsilon: 1e-5}, keras: "LayerNormalization",
			config: kw("axis", 1, "epsilon", 1e-5), in: ins(f32(3, 4, 6))},
		{name: "layer_norm_axis2_of_4", spec: nn.LayerNorm{Axis: -2}, keras: "LayerNormalization",
			config: kw("axis", -2), in: ins(f32(2, 3, 4, 5))},
		{name: "batch_norm_training", spec: nn.BatchNorm{Momentum: 0.9}, keras: "BatchNormalization",
			config: kw("momentum", 0.9), in: ins(f32(4, 3, 5)), training: true},
		{name: "batch_norm_inference", spec: nn.BatchNorm{}, keras: "BatchNormalization", in: ins(f32(4, 3, 5))},
		{name: "embedding", spec: nn.Embedding{InputDim: 7, OutputDim: 3}, keras: "Embedding",
			config: kw("input_dim", 7, "output_dim", 3), in: ins(ids32(7, 3, 4))},
		{name: "position_embedding", spec: nn.PositionEmbedding{SequenceLength: 6}, keras: "PositionEmbedding",
			config: kw("sequence_length", 6), in: ins(f32(2, 4, 3)), noInputGrads: true},
		{name: "token_and_position_embedding", spec: nn.TokenAndPositionEmbedding{VocabularySize: 9, SequenceLength: 5, EmbeddingDim: 4},
			keras: "TokenAndPositionEmbedding", config: kw("vocabulary_size", 9, "sequence_length", 5, "embedding_dim", 4), in: ins(ids32(9, 3, 5))},
		{name: "token_and_position_embedding_short", spec: nn.TokenAndPositionEmbedding{VocabularySize: 9, SequenceLength: 8, EmbeddingDim: 4},
			keras: "TokenAndPositionEmbedding", config: kw("vocabulary_size", 9, "sequence_length", 8, "embedding_dim", 4), in: ins(ids32(9, 3, 5))},
		{name: "token_and_position_embedding_any_length", spec: nn.TokenAndPositionEmbedding{VocabularySize: 9, SequenceLength: 8, EmbeddingDim: 4},
			keras: "TokenAndPositionEmbedding", config: kw("vocabulary_size", 9, "sequence_length", 8, "embedding_dim", 4), in: ins(ids32(9, 3, 5)), anyLength: true},
		{name: "position_embedding_any_length", spec: nn.PositionEmbedding{SequenceLength: 6}, keras: "PositionEmbedding",
			config: kw("sequence_length", 6), in: ins(f32(2, 4, 3)), noInputGrads: true, anyLength: true},
		{name: "dense_rank3_gelu_bfloat16", spec: nn.Dense{Units: 4, Activation: nn.GELU}, keras: "Dense",
			config: kw("units", 4, "activation", "gelu"), in: ins(f32(2, 3, 5)), policy: nn.MixedBfloat16, tol: 2e-2},
		{name: "dense_rank3_gelu_approximate_float16", spec: nn.Dense{Units: 4, Activation: nn.GELUTanh}, keras: "Dense",
			config: kw("units", 4, "activation", "gelu_approximate"), in: ins(f32(2, 3, 5)), policy: nn.MixedFloat16, tol: 5e-3},
		{name: "activation_silu_bfloat16", spec: nn.SiLU, keras: "Activation", config: kw("activation", "silu"),
			in: ins(f32(2, 3, 5)), policy: nn.MixedBfloat16, tol: 2e-2},
		{name: "softmax_float16", spec: nn.Softmax, keras: "Softmax", in: ins(f32(2, 3, 5)), policy: nn.MixedFloat16, tol: 5e-3},
		{name: "layer_norm_axis1_bfloat16", spec: nn.LayerNorm{Axis: 1}, keras: "LayerNormalization", config: kw("axis", 1),
			in: ins(f32(3, 4, 6)), policy: nn.MixedBfloat16, tol: 2e-2},
		{name: "global_average_pooling1d_bfloat16", spec: nn.GlobalAveragePooling1D{}, keras: "GlobalAveragePooling1D",
			in: ins(f32(3, 4, 5)), policy: nn.MixedBfloat16, tol: 2e-2},
		{name: "token_and_position_embedding_bfloat16", spec: nn.TokenAndPositionEmbedding{VocabularySize: 9, SequenceLength: 5, EmbeddingDim: 4},
			keras: "TokenAndPositionEmbedding", config: kw("vocabulary_size", 9, "sequence_length", 5, "embedding_dim", 4),
			in: ins(ids32(9, 3, 5)), policy: nn.MixedBfloat16, tol: 2e-2},
		{name: "global_average_pooling1d", spec: nn.GlobalAveragePooling1D{}, keras: "GlobalAveragePooling1D", in: ins(f32(3, 4, 5))},
		{name: "global_average_pooling2d", spec: nn.GlobalAveragePooling2D{}, keras: "GlobalAveragePooling2D", in: ins(f32(2, 4, 3, 5))},
		{name: "max_pool2d", spec: nn.MaxPool2D{Size: 2}, keras: "MaxPooling2D", config: kw("pool_size", 2), in: ins(f32(2, 6, 4, 3))},
		{name: "max_pool2d_same_strides1", spec: nn.MaxPool2D{Size: 3, Strides: 1, Padding: nn.Same}, keras: "MaxPooling2D",
			config: kw("pool_size", 3, "strides", 1, "padding", "same"), in: ins(f32(2, 5, 4, 2))},
		{name: "avg_pool2d", spec: nn.AvgPool2D{Size: 2}, keras: "AveragePooling2D", config: kw("pool_size", 2), in: ins(f32(2, 6, 4, 3))},
		{name: "avg_pool2d_same_strides2", spec: nn.AvgPool2D{Size: 3, Strides: 2, Padding: nn.Same}, keras: "AveragePooling2D",
			config: kw("pool_size", 3, "strides", 2, "padding", "same"), in: ins(f32(2, 5, 4, 2))},
		{name: "add", spec: nn.Add{}, keras: "Add", in: ins(f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 4))},
		{name: "multiply", spec: nn.Multiply{}, keras: "Multiply", in: ins(f32(2, 3, 4), f32(2, 3, 4))},
		{name: "concatenate_last", spec: nn.Concatenate{}, keras: "Concatenate", in: ins(f32(2, 3, 4), f32(2, 3, 2))},
		{name: "concatenate_minus2", spec: nn.Concatenate{Axis: -2}, keras: "Concatenate", config: kw("axis", -2),
			in: ins(f32(2, 3, 4), f32(2, 1, 4))},
		{name: "concatenate_axis1", spec: nn.Concatenate{Axis: 1}, keras: "Concatenate", config: kw("axis", 1),
			in: ins(f32(2, 3, 4), f32(2, 1, 4))},
	}...)
}

// kerasTensor is a tensor of a request: its values row-major.
type kerasTensor struct {
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Values any     `json:"values"`
}

// kerasLayerRequest is one case as testdata/keras_layers.py reads it.
type kerasLayerRequest struct {
	Name       string         `json:"name"`
	Class      string         `json:"class"`
	Config     map[string]any `json:"config"`
	Call       string         `json:"call,omitempty"`
	Kwargs     map[string]any `json:"call_kwargs,omitempty"`
	Training   bool           `json:"training"`
	Inputs     []kerasTensor  `json:"inputs"`
	InputGrads bool           `json:"input_grads"`
	Weights    [][]float32    `json:"weights"`
	Cotangent  []float32      `json:"cotangent"`
}

// kerasLayerResult is a layer's output, the gradients (the float inputs'
// first, then the trainable weights') and every weight after the call.
type kerasLayerResult struct {
	Output  []float64   `json:"output"`
	Shape   []int64     `json:"shape"`
	Grads   [][]float64 `json:"grads"`
	Weights [][]float64 `json:"weights"`
}

// Keras 3 and tfdist agree, layer by layer, on outputs, gradients and
// updated weights (see the top of this file).
func TestKerasLayers(t *testing.T) {
	python := pyenv.TensorFlow(t)
	cases := kerasLayerCases()
	reqs := make([]kerasLayerRequest, len(cases))
	ours := make([]kerasLayerResult, len(cases))
	for i, c := range cases {
		reqs[i], ours[i] = runKerasCase(t, i, c)
	}
	var answer map[string]kerasLayerResult
	python.JSON(t, filepath.Join("testdata", "keras_layers.py"), map[string]any{"cases": reqs}, &answer)
	type worstCase struct {
		diff float64
		name string
	}
	worst := map[string]worstCase{}
	for i, c := range cases {
		want, ok := answer[c.name]
		require.True(t, ok, "no answer for %s", c.name)
		got := ours[i]
		require.Equal(t, want.Shape, got.Shape, "%s: output shape", c.name)
		tol := c.tol
		if tol == 0 {
			tol = 1e-5
		}
		check := func(what string, got, want []float64) {
			d := kerasDiff(got, want)
			key := what
			if c.policy.Mixed() {
				key += " under a mixed policy"
			}
			if d >= worst[key].diff {
				worst[key] = worstCase{d, c.name}
			}
			if d > tol {
				t.Errorf("%s: %s differs from Keras by %.3g (relative to max(1, |Keras|))", c.name, what, d)
			}
		}
		check("output", got.Output, want.Output)
		require.Len(t, got.Grads, len(want.Grads), "%s: gradients", c.name)
		for k := range want.Grads {
			check("gradient", got.Grads[k], want.Grads[k])
		}
		require.Len(t, got.Weights, len(want.Weights), "%s: weights", c.name)
		for k := range want.Weights {
			check("weights after", got.Weights[k], want.Weights[k])
		}
	}
	for _, key := range slices.Sorted(maps.Keys(worst)) {
		t.Logf("largest difference from Keras: %s %.2g (%s)", key, worst[key].diff, worst[key].name)
	}
}

// kerasDiff returns the largest |a-b|/max(1, |b|), or +Inf when the lengths
// differ.
func kerasDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i])/max(1, math.Abs(b[i])))
	}
	return d
}

// runKerasCase builds case i's layer in a model of its own, runs it once
// on random inputs and returns the request for Keras and our result.
func runKerasCase(t *testing.T, i int, c kerasLayerCase) (kerasLayerRequest, kerasLayerResult) {
	t.Helper()
	ctx := context.Background()
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	rng := rand.New(rand.NewPCG(uint64(i), 40))
	req := newKerasRequest(c)
	syms, spec, feeds := kerasInputs(t, rng, c, &req)
	m, dxs := buildKerasModel(t, s, c, syms, i)
	weights := m.Vars()
	for _, v := range m.Variables() {
		if !v.Trainable() {
			weights = append(weights, v)
		}
	}
	req.Weights = readFloats(t, s, weights)
	var shape []int64
	step, err := s.Build(spec, kerasStep(t, c, m, dxs, rng, &req, &shape))
	require.NoError(t, err, c.name)
	res, err := s.RunReplicas(ctx, step, []map[string]*tf.Tensor{feeds}, int(c.in[0].shape[0]))
	require.NoError(t, err, c.name)

	got := kerasLayerResult{Output: widen(tensorutil.Float32s(res["y"][0])), Shape: shape}
	for k := 0; ; k++ {
		g, ok := res[fmt.Sprintf("g%02d", k)]
		if !ok {
			break
		}
		got.Grads = append(got.Grads, widen(tensorutil.Float32s(g[0])))
	}
	for _, w := range readFloats(t, s, weights) {
		got.Weights = append(got.Weights, widen(w))
	}
	return req, got
}

// newKerasRequest returns what the Keras side is asked to build for c.
func newKerasRequest(c kerasLayerCase) kerasLayerRequest {
	req := kerasLayerRequest{Name: c.name, Class: c.keras, Config: maps.Clone(c.config), Call: c.call, Kwargs: c.kwargs,
		Training: c.training, InputGrads: !c.noInputGrads}
	if c.policy.Mixed() {
		if req.Config == nil {
			req.Config = map[string]any{}
		}
		req.Config["dtype"] = c.policy.Name()
	}
	return req
}

// kerasInputs draws c's inputs into req and returns the model's symbolic
// inputs, the step's input spec and its feeds.
func kerasInputs(t *testing.T, rng *rand.Rand, c kerasLayerCase, req *kerasLayerRequest) ([]*nn.Tensor, strategy.InputSpec, map[string]*tf.Tensor) {
	syms := make([]*nn.Tensor, len(c.in))
	spec, feeds := strategy.InputSpec{}, map[string]*tf.Tensor{}
	for j, in := range c.in {
		name := fmt.Sprintf("x%d", j)
		kt := randomKerasInput(rng, in)
		req.Inputs = append(req.Inputs, kt)
		dtype := tf.Float
		if in.ids > 0 {
			dtype = tf.Int32
		}
		syms[j] = nn.InputOf(dtype, in.shape[1:]...)
		if c.anyLength {
			syms[j] = nn.InputOf(dtype, append([]int64{-1}, in.shape[2:]...)...)
		}
		spec[name] = strategy.TensorSpec{DType: dtype, Shape: in.shape}
		feeds[name] = kerasTensorOf(t, dtype, in.shape, kt.Values)
	}
	return syms, spec, feeds
}

// buildKerasModel builds the one-layer model of c on syms and, for each
// float input, a zero variable of its shape, which the step adds to the
// input so that its gradient is the input's.
func buildKerasModel(t *testing.T, s *onedevice.Strategy, c kerasLayerCase, syms []*nn.Tensor, i int) (*nn.Model, map[int]strategy.Variable) {
	dxs := map[int]strategy.Variable{}
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) error {
		for j, in := range c.in {
			if in.ids == 0 && !c.noInputGrads {
				v, err := sc.Variable(fmt.Sprintf("dx%d", j), tf.Float, in.shape, strategy.Zeros())
				if err != nil {
					return err
				}
				dxs[j] = v
			}
		}
		var err error
		m, err = nn.NewModel(sc, "m", syms, []*nn.Tensor{nn.Share(c.spec).Call(syms...)}, nn.WithSeed(int64(i)))
		return err
	}), c.name)
	return m, dxs
}

// kerasStep returns the step that applies m under c's policy and returns
// its output "y" and the gradients "g00", … of the output's product with
// a random cotangent (drawn into req) with respect to the inputs and the
// trainable weights; it sets shape to the output's.
func kerasStep(t *testing.T, c kerasLayerCase, m *nn.Model, dxs map[int]strategy.Variable, rng *rand.Rand,
	req *kerasLayerRequest, shape *[]int64) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		b := nn.NewBuilder(r.Scope(), "keras_case")
		xs := make([]tf.Output, len(c.in))
		var wrt []strategy.Variable
		for j := range c.in {
			xs[j] = in[fmt.Sprintf("x%d", j)]
			if v, ok := dxs[j]; ok {
				dx, err := r.Read(v)
				if err != nil {
					return nil, err
				}
				xs[j] = b.Add(xs[j], dx)
				wrt = append(wrt, v)
			}
		}
		ys, err := m.WithPolicy(c.policy).Outputs(r, xs, c.training)
		if err != nil {
			return nil, err
		}
		if *shape, err = ys[0].Shape().ToSlice(); err != nil {
			return nil, err
		}
		req.Cotangent = make([]float32, elements(*shape))
		for k := range req.Cotangent {
			req.Cotangent[k] = float32(rng.Float64()*2 - 1)
		}
		loss := b.SumAll(b.Mul(ys[0], b.Const(kerasTensorOf(t, tf.Float, *shape, req.Cotangent))))
		grads, err := r.Gradients(loss, append(wrt, m.Vars()...))
		if err != nil {
			return nil, err
		}
		out := strategy.Outputs{"y": ys[0]}
		for k, g := range grads {
			out[fmt.Sprintf("g%02d", k)] = g
		}
		return out, b.Err()
	}
}

// readFloats reads vs's float32 values.
func readFloats(t *testing.T, s *onedevice.Strategy, vs []strategy.Variable) [][]float32 {
	vals, err := strategy.ReadVariables(context.Background(), s, vs)
	require.NoError(t, err)
	out := make([][]float32, len(vals))
	for k, v := range vals {
		out[k] = v.Float32
	}
	return out
}

// randomKerasInput returns random values for in.
func randomKerasInput(rng *rand.Rand, in kerasInput) kerasTensor {
	n := elements(in.shape)
	if in.ids > 0 {
		v := make([]int32, n)
		for k := range v {
			v[k] = int32(rng.IntN(in.ids))
		}
		return kerasTensor{DType: "int32", Shape: in.shape, Values: v}
	}
	v := make([]float32, n)
	for k := range v {
		v[k] = float32(rng.Float64()*4 - 2)
	}
	return kerasTensor{DType: "float32", Shape: in.shape, Values: v}
}

// kerasTensorOf returns a tensor of dtype and shape holding values, a flat
// []float32 or []int32.
func kerasTensorOf(t *testing.T, dtype tf.DataType, shape []int64, values any) *tf.Tensor {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, values))
	x, err := tf.ReadTensor(dtype, shape, &buf)
	require.NoError(t, err)
	return x
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func elements(d []int64) int64 {
	p := int64(1)
	for _, v := range d {
		p *= v
	}
	return p
}
