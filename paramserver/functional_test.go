package paramserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// tinyTransformer is a one-block causal Transformer over sequences of 6
// tokens of a vocabulary of 11. Its attention has no biases: the keys'
// bias has no gradient (the softmax ignores it), so its values would be
// rounding noise that no two engines agree on.
func tinyTransformer(sc strategy.Scope) (*nn.Model, error) {
	ids := nn.InputOf(tf.Int32, 6)
	x := nn.TokenAndPositionEmbedding{VocabularySize: 11, SequenceLength: 6, EmbeddingDim: 8}.Call(ids)
	h := nn.MultiHeadAttention{NumHeads: 2, KeyDim: 4, UseCausalMask: true, NoBias: true}.Call(nn.LayerNorm{}.Call(x), nn.LayerNorm{}.Call(x))
	x = nn.Add{}.Call(x, h)
	h = nn.Dense{Units: 16, Activation: nn.GELU}.Call(nn.LayerNorm{}.Call(x))
	x = nn.Add{}.Call(x, nn.Dense{Units: 8}.Call(h))
	return nn.NewModel(sc, "lm", []*nn.Tensor{ids}, []*nn.Tensor{nn.Dense{Units: 11}.Call(x)}, nn.WithSeed(5))
}

// lmStep is a step of opt on the per-token cross-entropy of the next
// token; under parameter servers the looked-up embeddings take sparse's
// updates of the rows the step looked up, or opt's (densified) when sparse
// is nil.
func lmStep(m *nn.Model, opt strategy.Optimizer, sparse strategy.SparseOptimizer) strategy.ReplicaFn {
	var opts []strategy.MinimizeOption
	if sparse != nil {
		opts = append(opts, strategy.WithSparseOptimizer(sparse))
	}
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := m.Apply(r, in["x"], true)
		if err != nil {
			return nil, err
		}
		b := nn.NewBuilder(r.Scope(), "loss")
		flat := b.Reshape(logits, -1, 11)
		loss, err := nn.ComputeAverageLoss(r, nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("xent"), flat, b.Reshape(in["y"], -1), 11))
		if err != nil {
			return nil, err
		}
		return nil, r.Minimize(opt, loss, m.Vars(), opts...)
	}
}

// lmGradientStep is lmStep's loss, differentiated by Gradients and
// applied by ApplyGradients with opt: the two halves of Minimize, as a
// custom training step uses them.
func lmGradientStep(m *nn.Model, opt strategy.Optimizer, _ strategy.SparseOptimizer) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := m.Apply(r, in["x"], true)
		if err != nil {
			return nil, err
		}
		b := nn.NewBuilder(r.Scope(), "loss")
		loss, err := nn.ComputeAverageLoss(r, nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("xent"), b.Reshape(logits, -1, 11), b.Reshape(in["y"], -1), 11))
		if err != nil {
			return nil, err
		}
		grads, err := r.Gradients(loss, m.Vars())
		if err != nil {
			return nil, err
		}
		return nil, r.ApplyGradients(opt, grads, m.Vars())
	}
}

var lmSpec = strategy.InputSpec{"x": {DType: tf.Int32, Shape: []int64{-1, 6}}, "y": {DType: tf.Int32, Shape: []int64{-1, 6}}}

// lmBatch is 4 sequences and their next tokens.
func lmBatch(t *testing.T) dataset.Element {
	var x, y [][]int32
	for i := range 4 {
		var xs, ys []int32
		for j := range 6 {
			xs, ys = append(xs, int32((i*3+j*j)%11)), append(ys, int32((i*3+(j+1)*(j+1))%11))
		}
		x, y = append(x, xs), append(y, ys)
	}
	return dataset.Element{"x": tensor(t, x), "y": tensor(t, y)}
}

// A functional Transformer, defined once, trains on parameter servers with
// its variables in shards over two ps tasks: two steps there, scheduled
// one after the other, end with the variables of the same two steps on
// one device, element by element. So they do whether the embeddings take
// SGD's sparse update of the rows looked up or, with no sparse optimizer,
// Adam's dense update, as Keras's Adam updates an embedding; and so they do
// when the step calls Gradients and ApplyGradients instead of Minimize.
func TestFunctionalModelOnShardedVariables(t *testing.T) {
	adam := func() strategy.Optimizer { return optimizer.NewAdam(optimizer.Constant(0.01)) }
	for _, tc := range []struct {
		name   string
		step   func(*nn.Model, strategy.Optimizer, strategy.SparseOptimizer) strategy.ReplicaFn
		opt    func() strategy.Optimizer
		sparse strategy.SparseOptimizer
	}{
		{"sgd and sparse sgd", lmStep, func() strategy.Optimizer { return optimizer.NewSGD(optimizer.Constant(0.5)) }, optimizer.SparseSGD{LearningRate: 0.5}},
		{"adam everywhere", lmStep, adam, nil},
		{"gradients then apply", lmGradientStep, adam, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := trainLMOnOneDevice(t, tc.opt(), tc.sparse)
			got := trainLMOnShards(t, tc.step, tc.opt(), tc.sparse)
			diff, name, i := strategy.MaxDiff(want, got)
			assert.Less(t, diff, 1e-5, "%s[%d]", name, i)
		})
	}
}

// trainLMOnOneDevice runs two steps of the tiny Transformer on the default
// strategy and returns its variables.
func trainLMOnOneDevice(t *testing.T, opt strategy.Optimizer, sparse strategy.SparseOptimizer) []strategy.VariableValue {
	ctx := testContext(t, 2*time.Minute)
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	var m *nn.Model
	require.NoError(t, def.Scope(func(sc strategy.Scope) (err error) { m, err = tinyTransformer(sc); return err }))
	fn, err := def.Build(lmSpec, lmStep(m, opt, sparse))
	require.NoError(t, err)
	batch := lmBatch(t)
	for range 2 {
		_, err = def.RunReplicas(ctx, fn, []map[string]*tf.Tensor{batch}, 4)
		require.NoError(t, err)
	}
	vals, err := strategy.ReadVariables(ctx, def, m.Vars())
	require.NoError(t, err)
	return vals
}

// trainLMOnShards runs two steps of the tiny Transformer (step), one after the
// other, on one worker and two ps tasks, most variables in two shards, and
// returns its variables.
func trainLMOnShards(t *testing.T, step func(*nn.Model, strategy.Optimizer, strategy.SparseOptimizer) strategy.ReplicaFn,
	opt strategy.Optimizer, sparse strategy.SparseOptimizer) []strategy.VariableValue {
	ctx := testContext(t, 2*time.Minute)
	s := newInProcess(t, 1, 2, WithPartitioner(FixedShards(2)))
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) { m, err = tinyTransformer(sc); return err }))
	sharded := 0
	for _, v := range m.Vars() {
		if v.(*Variable).NumShards() > 1 {
			sharded++
		}
	}
	assert.Greater(t, sharded, 10, "most variables are in two shards")
	fn, err := s.Build(lmSpec, step(m, opt, sparse))
	require.NoError(t, err)
	c := newCoordinator(t, s)
	for range 2 {
		_, err := c.Schedule(fn, Feed(lmBatch(t)))
		require.NoError(t, err)
		require.NoError(t, c.Join(ctx))
	}
	got, err := strategy.ReadVariables(ctx, s, m.Vars())
	require.NoError(t, err)
	return got
}
