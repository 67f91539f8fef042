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

// Clipped is an optimizer that clips the gradients it is given before
// another optimizer applies them: by their global norm (ClipByGlobalNorm,
// Keras' global_clipnorm) or element by element (ClipByValue, Keras'
// clipvalue).
//
// The strategy decides which gradients one Apply sees. Under the in-graph
// engine (default, Mirrored, MultiWorkerMirrored) Apply gets every
// variable of a Minimize call with its gradient already summed across all
// replicas, so the global norm is the norm of the reduced gradient and
// every replica clips by the same factor: the copies stay identical. Under
// the parameter-server strategy Apply gets a worker's own gradient, cut
// into the shards of its variables, and the global norm is taken over all
// of them: a sharded variable is clipped as one, as if it were whole.
//
// Rows updated by a strategy.SparseOptimizer (the parameter-server
// strategy's looked-up variables, given with strategy.WithSparseOptimizer)
// are not clipped, and their gradients do not count in the global norm.
type Clipped struct {
	inner strategy.Optimizer
	name  string
	clip  func(ac strategy.ApplyContext, s *op.Scope, grads []tf.Output) ([]tf.Output, error)
}

var _ strategy.Optimizer = (*Clipped)(nil)

// ClipByGlobalNorm returns inner with every gradient of an update scaled by
// clipNorm / max(globalNorm, clipNorm), where globalNorm is the L2 norm of
// all the update's gradients taken together: tf.clip_by_global_norm, which
// Keras applies for global_clipnorm, except that the squares are summed in
// float64 (so finite gradients whose squares overflow float32 are clipped,
// and sharded optimizer state finds the unsharded norm). A non-finite
// global norm makes every gradient NaN, as there. clipNorm must be
// positive and finite.
func ClipByGlobalNorm(inner strategy.Optimizer, clipNorm float32) (*Clipped, error) {
	if err := checkClip("ClipByGlobalNorm", "clipNorm", inner, clipNorm); err != nil {
		return nil, err
	}
	return &Clipped{inner: inner, name: "clip_by_global_norm", clip: func(ac strategy.ApplyContext, s *op.Scope, grads []tf.Output) ([]tf.Output, error) {
		return clipByGlobalNorm(ac, s, grads, clipNorm)
	}}, nil
}

// ClipByValue returns inner with every element of every gradient clipped
// to [-clip, clip], as Keras' clipvalue. clip must be positive and finite.
func ClipByValue(inner strategy.Optimizer, clip float32) (*Clipped, error) {
	if err := checkClip("ClipByValue", "clip", inner, clip); err != nil {
		return nil, err
	}
	return &Clipped{inner: inner, name: "clip_by_value", clip: func(_ strategy.ApplyContext, s *op.Scope, grads []tf.Output) ([]tf.Output, error) {
		out := make([]tf.Output, len(grads))
		for i, g := range grads {
			gs := s.SubScope(fmt.Sprintf("grad_%d", i)).WithDevice(g.Op.Device())
			c := graphutil.CastTo(gs, op.Const(gs.SubScope("clip"), clip), g.DataType())
			out[i] = op.ClipByValue(gs, g, op.Neg(gs.SubScope("neg"), c), c)
		}
		return out, nil
	}}, nil
}

func checkClip(fn, field string, inner strategy.Optimizer, v float32) error {
	if inner == nil {
		return fmt.Errorf("optimizer: %s: nil inner optimizer", fn)
	}
	if !(v > 0) || math.IsInf(float64(v), 1) {
		return fmt.Errorf("optimizer: %s: %s is %v, expected a positive finite number", fn, field, v)
	}
	return nil
}

// Apply implements strategy.Optimizer: it clips grads, then has the inner
// optimizer apply them.
func (c *Clipped) Apply(ac strategy.ApplyContext, grads []tf.Output, vars []strategy.Variable) (*tf.Operation, error) {
	if len(grads) != len(vars) {
		return nil, fmt.Errorf("%d gradients for %d variables", len(grads), len(vars))
	}
	for i, g := range grads {
		if g.Op == nil {
			return nil, fmt.Errorf("%s: gradient %d has no op", c.name, i)
		}
	}
	if len(grads) == 0 {
		return nil, errors.New(c.name + ": no gradients")
	}
	s := ac.Scope().SubScope(c.name)
	clipped, err := c.clip(ac, s, grads)
	if err == nil {
		err = s.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	return c.inner.Apply(ac, clipped, vars)
}

// clipByGlobalNorm is tf.clip_by_global_norm: every gradient times
// clipNorm * min(1/norm, 1/clipNorm), plus norm-norm, which is NaN when the
// norm is not finite. Each gradient's sum of squares (in float64, see
// squaresWide) and its scaling run on the gradient's device; the norm, on
// the first gradient's.
func clipByGlobalNorm(ac strategy.ApplyContext, s *op.Scope, grads []tf.Output, clipNorm float32) ([]tf.Output, error) {
	squares := make([]tf.Output, len(grads))
	for i, g := range grads {
		gs := s.SubScope(fmt.Sprintf("square_%d", i)).WithDevice(g.Op.Device())
		squares[i] = squaresWide(gs, g)
	}
	ns := s.SubScope("norm").WithDevice(grads[0].Op.Device())
	total, err := acrossShards(ac, ns.SubScope("across"), op.AddN(ns.SubScope("sum"), squares))
	if err != nil {
		return nil, err
	}
	norm := op.Cast(ns, op.Sqrt(ns.SubScope("sqrt"), total), tf.Float)
	one := op.Const(ns.SubScope("one"), float32(1))
	c := op.Const(ns.SubScope("clip_norm"), clipNorm)
	scale := op.Mul(ns.SubScope("scale"), c, op.Minimum(ns.SubScope("min"), op.Div(ns.SubScope("inv_norm"), one, norm), op.Div(ns.SubScope("inv_clip"), one, c)))
	scale = op.Add(ns.SubScope("nan_if_not_finite"), scale, op.Sub(ns.SubScope("zero_if_finite"), norm, norm))
	out := make([]tf.Output, len(grads))
	for i, g := range grads {
		gs := s.SubScope(fmt.Sprintf("scale_%d", i)).WithDevice(g.Op.Device())
		out[i] = op.Mul(gs, g, graphutil.CastTo(gs, scale, g.DataType()))
	}
	return out, nil
}

// acrossShards returns x summed across the shards of the variables that
// ac addresses (strategy.ShardedApply): x itself unless they are shards.
func acrossShards(ac strategy.ApplyContext, s *op.Scope, x tf.Output) (tf.Output, error) {
	if sa, ok := ac.(strategy.ShardedApply); ok {
		return sa.SumShards(s, x)
	}
	return x, nil
}
