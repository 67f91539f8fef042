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

// weightNorm returns the Euclidean norm of v, whose value w is: under
// sharded optimizer state (strategy.ShardedApply), where v and w are a
// shard, that of the whole variable, which every worker holds.
func weightNorm(ac strategy.ApplyContext, s *op.Scope, v strategy.Variable, w tf.Output) tf.Output {
	if sa, ok := ac.(strategy.ShardedApply); ok {
		w = sa.WholeValue(s.SubScope("whole"), v)
	}
	return norm(s, w)
}

// updateNorm returns the Euclidean norm of x, an update or a gradient of
// a variable, from its sum of squares in float64 (squaresWide): under
// sharded optimizer state (strategy.ShardedApply), where x is a shard's,
// of the whole, every shard's sum added across the workers. Summing in
// float64 is what makes both the same float32 norm: no two float32 sums
// of a different grouping would be.
func updateNorm(ac strategy.ApplyContext, s *op.Scope, x tf.Output) (tf.Output, error) {
	sum, err := acrossShards(ac, s.SubScope("across"), squaresWide(s.SubScope("squares"), x))
	if err != nil {
		return tf.Output{}, err
	}
	return op.Cast(s, op.Sqrt(s.SubScope("sqrt"), sum), x.DataType()), nil
}

// squaresWide is the sum of x's squares, all its elements together, in
// float64: each square of a float32 is exact there, no sum of them
// overflows, and the sum's rounding is far below float32's, whatever the
// grouping.
func squaresWide(s *op.Scope, x tf.Output) tf.Output {
	wide := graphutil.CastTo(s.SubScope("wide"), x, tf.Double)
	return graphutil.SumAll(s.SubScope("sum"), op.Square(s.SubScope("square"), wide))
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
