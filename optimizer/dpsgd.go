package optimizer

import (
	"errors"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// DPConfig configures DP-SGD (DPSGD).
type DPConfig struct {
	// ClipNorm is C, the L2 norm each example's gradient, over all the
	// variables of the Minimize together, is clipped to.
	ClipNorm float32
	// NoiseMultiplier is σ: the noise added to the sum of the clipped
	// gradients has standard deviation σ·C.
	NoiseMultiplier float32
	// ExpectedBatch is the expected number of examples in a global step
	// (the sampling rate times the number of examples, under Poisson
	// sampling): the noisy sum is divided by it, not by the step's actual
	// count, which would reveal it.
	ExpectedBatch float64
	// MaxExamples is the most examples one replica's batch may hold; the
	// step builds one gradient per example up to it.
	MaxExamples int
	// Seed keys the noise: step k's noise is drawn by TensorFlow's
	// stateless generator from (Seed, k), so every replica and worker adds
	// the same noise, and a run resumed from a checkpoint (which holds k)
	// continues the stream.
	Seed int64
}

// Private is DP-SGD (Abadi et al., 2016) around another optimizer: see
// DPSGD.
type Private struct {
	inner strategy.Optimizer
	cfg   DPConfig
}

var _ strategy.PrivateOptimizer = (*Private)(nil)

// DPSGD returns inner trained with DP-SGD: Minimize's loss is one value
// per example (not averaged); each example's gradient is clipped to
// c.ClipNorm; the clipped gradients are summed over every replica of
// every worker; Gaussian noise of standard deviation
// c.NoiseMultiplier·c.ClipNorm is added once per global step; and the sum
// is divided by c.ExpectedBatch before inner applies it. Package
// accountant gives the privacy this spends. The default, mirrored and
// multiworker strategies run it; the parameter-server strategy refuses
// it, and so does WithAccumulation.
func DPSGD(inner strategy.Optimizer, c DPConfig) (*Private, error) {
	switch {
	case inner == nil:
		return nil, errors.New("optimizer: DPSGD: nil inner optimizer")
	case !(c.ClipNorm > 0) || math.IsInf(float64(c.ClipNorm), 1):
		return nil, fmt.Errorf("optimizer: DPSGD: clip norm %v: expected a positive finite number", c.ClipNorm)
	case !(c.NoiseMultiplier >= 0) || math.IsInf(float64(c.NoiseMultiplier), 1):
		return nil, fmt.Errorf("optimizer: DPSGD: noise multiplier %v: expected a finite number >= 0", c.NoiseMultiplier)
	case !(c.ExpectedBatch > 0) || math.IsInf(c.ExpectedBatch, 1):
		return nil, fmt.Errorf("optimizer: DPSGD: expected batch %v: expected a positive finite number of examples", c.ExpectedBatch)
	case c.MaxExamples < 1:
		return nil, fmt.Errorf("optimizer: DPSGD: at most %d examples per replica: expected at least 1", c.MaxExamples)
	}
	if _, ok := inner.(strategy.LossScaler); ok {
		return nil, fmt.Errorf("optimizer: DPSGD: inner optimizer %T scales the loss, which per-example clipping does not support", inner)
	}
	return &Private{inner: inner, cfg: c}, nil
}

// MaxExamples implements strategy.PrivateOptimizer.
func (p *Private) MaxExamples() int { return p.cfg.MaxExamples }

// ClipExample implements strategy.PrivateOptimizer: the example's
// gradients scaled so that their global norm is at most the clip norm.
func (p *Private) ClipExample(s *op.Scope, grads []tf.Output) []tf.Output {
	// An example's gradients are whole: no sum across shards, no error.
	out, _ := clipByGlobalNorm(nil, s, grads, p.cfg.ClipNorm)
	return out
}

// Apply implements strategy.Optimizer: grads are the clipped gradients
// summed over the global step's examples; it adds the step's noise,
// divides by the expected batch, has the inner optimizer apply the result
// and counts the step.
func (p *Private) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if len(grads) != len(vars) || len(grads) == 0 {
		return nil, fmt.Errorf("dp_sgd: %d gradients for %d variables", len(grads), len(vars))
	}
	step, err := ac.NonSlot("dp_sgd", "step", tf.Int64, []int64{}, strategy.Zeros())
	if err != nil {
		return nil, fmt.Errorf("dp_sgd: %w", err)
	}
	s := ac.Scope().SubScope("dp_sgd")
	handle := ac.Handle(step)
	k := op.ReadVariableOp(s.SubScope("step"), handle, tf.Int64)
	noisy := make([]tf.Output, len(grads))
	for i, g := range grads {
		noisy[i] = p.noisy(s.SubScope(fmt.Sprintf("grad_%d", i)).WithDevice(g.Op.Device()), ac, vars[i], g, k, i, len(grads))
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("dp_sgd: %w", err)
	}
	apply, err := p.inner.Apply(ac, noisy, vars)
	if err != nil {
		return nil, err
	}
	cs := s.WithControlDependencies(apply)
	count := op.AssignAddVariableOp(cs.SubScope("count"), handle, op.Const(cs.SubScope("one"), int64(1)))
	return op.NoOp(s.SubScope("done").WithControlDependencies(apply, count)), s.Err()
}

// noisy returns (g + N(0, (σC)²)) / expected batch, the noise of gradient
// i of n at step k drawn from the stream (Seed, k·n + i). The gradient of
// a shard of v (strategy.ShardedApply) gets the shard's part of the whole
// variable's noise.
func (p *Private) noisy(s *op.Scope, ac strategy.ApplyContext, v strategy.Variable, g, k tf.Output, i, n int) tf.Output {
	stream := op.Add(s.SubScope("stream"), op.Mul(s.SubScope("steps"), k, op.Const(s.SubScope("n"), int64(n))), op.Const(s.SubScope("i"), int64(i)))
	seed := op.Pack(s.SubScope("seed"), []tf.Output{op.Const(s.SubScope("key"), p.cfg.Seed), stream})
	sa, sharded := ac.(strategy.ShardedApply)
	if !sharded {
		return p.noised(s, g, op.StatelessRandomNormal(s.SubScope("normal"), op.Shape(s.SubScope("shape"), g), seed, op.StatelessRandomNormalDtype(tf.Float)))
	}
	whole, lo := sa.Whole(v)
	noise := op.StatelessRandomNormal(s.SubScope("normal"), op.Const(s.SubScope("whole"), whole), seed, op.StatelessRandomNormalDtype(tf.Float))
	flat := op.Reshape(s.SubScope("flat"), noise, op.Const(s.SubScope("minus_one"), []int32{-1}))
	return p.noised(s, g, op.Slice(s.SubScope("shard"), flat, op.Const(s.SubScope("begin"), []int64{lo}), op.Const(s.SubScope("size"), v.Shape())))
}

// noised returns (g + σC·noise) / expected batch, for noise of standard
// normal values.
func (p *Private) noised(s *op.Scope, g, noise tf.Output) tf.Output {
	stddev := op.Const(s.SubScope("stddev"), p.cfg.NoiseMultiplier*p.cfg.ClipNorm)
	noise = graphutil.CastTo(s, op.Mul(s.SubScope("scaled"), noise, stddev), g.DataType())
	batch := graphutil.CastTo(s.SubScope("batch"), op.Const(s.SubScope("expected"), float32(p.cfg.ExpectedBatch)), g.DataType())
	return op.Div(s.SubScope("mean"), op.Add(s.SubScope("add"), g, noise), batch)
}
