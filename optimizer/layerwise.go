package optimizer

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// layerwise is what LARS and LAMB share: hyperparameters, and the
// variables excluded from weight decay and from layer adaptation (the
// trust ratio).
//
// The trust ratio is computed per variable, from the norms of the copy or
// shard the update addresses: under the parameter-server strategy each
// shard of a sharded variable has its own trust ratio, from its own rows,
// as if it were a variable of its own.
type layerwise struct {
	base
	h                hyper
	noDecay, noAdapt exclusions
}

// newLayerwise builds a layerwise optimizer named name from its defaults
// and the options it accepts; the default exclusions are
// DefaultExclusions.
func newLayerwise(name string, lr Schedule, defLR float32, def hyper, accepted []string, opts []Option) (layerwise, error) {
	def.decayExclude = DefaultExclusions()
	accepted = append(accepted, "WithWeightDecay", "WithEpsilon", "ExcludeFromWeightDecay", "ExcludeFromLayerAdaptation")
	h, err := newHyper(name, def, accepted, opts)
	if err != nil {
		return layerwise{}, err
	}
	o := layerwise{base: base{name: name, lr: scheduleOr(lr, defLR)}, h: h}
	if o.noDecay, err = compileExclusions(name+": ExcludeFromWeightDecay", h.decayExclude); err != nil {
		return layerwise{}, err
	}
	if o.noAdapt, err = compileExclusions(name+": ExcludeFromLayerAdaptation", h.adaptExclude); err != nil {
		return layerwise{}, err
	}
	if err := validateSchedule(o.lr); err != nil {
		return layerwise{}, fmt.Errorf("%s: %w", name, err)
	}
	return o, nil
}

// weightDecay returns the weight decay rate of v: 0 if it is excluded.
func (o *layerwise) weightDecay(v strategy.Variable) float32 {
	if o.noDecay.match(v) {
		return 0
	}
	return o.h.weightDecay
}

// norms returns the Euclidean norms of xs, each over all its elements:
// under sharded optimizer state (strategy.ShardedApply), where xs are
// shards, over the whole of each, from one sum of every shard's sums of
// squares.
func norms(ac strategy.ApplyContext, s *op.Scope, xs ...tf.Output) ([]tf.Output, error) {
	out := make([]tf.Output, len(xs))
	sa, sharded := ac.(strategy.ShardedApply)
	if !sharded {
		for i, x := range xs {
			out[i] = norm(s.SubScope(fmt.Sprintf("norm_%d", i)), x)
		}
		return out, nil
	}
	sums := make([]tf.Output, len(xs))
	for i, x := range xs {
		sums[i] = graphutil.SumAll(s.SubScope(fmt.Sprintf("sum_%d", i)), op.Square(s.SubScope(fmt.Sprintf("square_%d", i)), x))
	}
	total, err := sa.SumShards(s.SubScope("across"), op.Pack(s.SubScope("sums"), sums))
	if err != nil {
		return nil, err
	}
	for i, t := range op.Unpack(s.SubScope("each"), total, int64(len(xs))) {
		out[i] = op.Sqrt(s.SubScope(fmt.Sprintf("sqrt_%d", i)), t)
	}
	return out, nil
}

// norm is the Euclidean norm of x, all its elements together.
func norm(s *op.Scope, x tf.Output) tf.Output {
	flat := op.Reshape(s.SubScope("flat"), x, op.Const(s.SubScope("shape"), []int32{-1}))
	sum := op.Sum(s.SubScope("sum"), op.Square(s.SubScope("square"), flat), op.Const(s.SubScope("axis"), int32(0)))
	return op.Sqrt(s.SubScope("sqrt"), sum)
}

// guarded is ratio where both norms are positive, else 1: the guard of
// LARS's and LAMB's reference implementations for a variable or an update
// that is all zeros.
func guarded(s *op.Scope, ratio, wNorm, uNorm tf.Output) tf.Output {
	zero := op.ZerosLike(s.SubScope("zero"), wNorm)
	both := op.LogicalAnd(s.SubScope("both"), op.Greater(s.SubScope("w_positive"), wNorm, zero), op.Greater(s.SubScope("u_positive"), uNorm, zero))
	return op.Select(s.SubScope("ratio"), both, ratio, op.OnesLike(s.SubScope("one"), ratio))
}
