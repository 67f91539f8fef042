package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// LossOption configures ComputeAverageLoss and ReduceLoss.
type LossOption func(*lossConfig)

type lossConfig struct {
	weight      tf.Output
	weighted    bool
	globalBatch int
	global      bool
}

// SampleWeight multiplies the loss by w (any real type) before it is
// reduced, w squeezed or expanded to the loss's rank as ComputeAverageLoss
// and ReduceLoss say, then broadcast.
func SampleWeight(w tf.Output) LossOption {
	return func(c *lossConfig) { c.weight, c.weighted = w, true }
}

// GlobalBatchSize makes ComputeAverageLoss divide by n (0 or more)
// instead of the loss's leading dimension times the replicas in sync:
// tf.nn.compute_average_loss's global_batch_size. ReduceLoss refuses it.
func GlobalBatchSize(n int) LossOption {
	return func(c *lossConfig) { c.globalBatch, c.global = n, true }
}

// ComputeAverageLoss is tf.nn.compute_average_loss: the sum of every
// element of perExample (rank 1 or more, times its SampleWeight) divided
// by the global batch size, and 0 when that is 0. The global batch size
// is GlobalBatchSize(n) when given, else perExample's leading dimension
// times the replicas in sync, r.NumReplicasInSync(): the replicas whose
// gradients one update sums under the default strategy, Mirrored and
// MultiWorkerMirrored, and 1 for a parameter-server worker, which applies
// its own update (as tf.distribute's ParameterServerStrategy has one
// replica in sync per CPU worker), or a SavedModel signature.
//
// The leading dimension is what it averages over. A per-example loss
// [batch] gives the global batch's mean when every replica's batch has
// the same size, and a per-token loss flattened to [batch·time] the mean
// per token; a per-token loss [batch, time] gives the mean over examples
// of each example's sum over tokens, time times the mean per token. A
// replica whose batch is smaller (a partial last batch) still divides by
// its own size times the replicas, so its examples weigh more than the
// others'. Replica.AverageLoss, which divides by the examples of the whole
// global step, is this function with GlobalBatchSize set to them, exact
// for a partial batch, when perExample holds one value per example.
//
// As TensorFlow does, the loss and a sample weight are cast to float32,
// the weight's last axis is squeezed when its rank is the loss's plus one
// and one is added when it is the loss's minus one (so per-example
// weights [batch] weigh a per-token loss [batch, time]), the product is
// broadcast and cast back to perExample's type. perExample must be
// floating-point; a scalar is an error, an unknown rank is checked when
// the step runs, and a sample weight other than a scalar needs ranks the
// graph knows.
func ComputeAverageLoss(r strategy.Replica, perExample tf.Output, opts ...LossOption) (tf.Output, error) {
	c := newLossConfig(opts)
	if err := checkLoss(perExample, c); err != nil {
		return tf.Output{}, fmt.Errorf("nn.ComputeAverageLoss: %w", err)
	}
	if c.global && c.globalBatch < 0 {
		return tf.Output{}, fmt.Errorf("nn.ComputeAverageLoss: GlobalBatchSize(%d): expected 0 or more examples", c.globalBatch)
	}
	if n := perExample.Shape().NumDimensions(); n == 0 {
		return tf.Output{}, fmt.Errorf("nn.ComputeAverageLoss: perExample is a scalar; expected rank 1 or more, one row per example")
	}
	b := NewBuilder(r.Scope(), "average_loss")
	var out tf.Output
	err := graphutil.Safely(func() (err error) {
		out, err = averageLoss(b, r, perExample, c)
		return err
	})
	if err != nil {
		return tf.Output{}, fmt.Errorf("nn.ComputeAverageLoss: %w", err)
	}
	return out, nil
}

// averageLoss builds ComputeAverageLoss on b.
func averageLoss(b *Builder, r strategy.Replica, x tf.Output, c lossConfig) (tf.Output, error) {
	dtype := x.DataType()
	if x.Shape().NumDimensions() < 0 {
		x = b.assertRankAtLeast1(x, "nn.ComputeAverageLoss: perExample must have rank 1 or more, one row per example")
	}
	if c.weighted {
		var err error
		if x, err = scaleBySampleWeight(b, x, c.weight); err != nil {
			return tf.Output{}, err
		}
	}
	var n tf.Output
	if c.global {
		n = b.Const(int64(c.globalBatch))
	} else {
		n = b.Mul(b.Count(x, tf.Int32), b.Const(int32(r.NumReplicasInSync())))
	}
	out := b.DivNoNan(b.SumAll(x), b.Cast(n, dtype))
	return out, b.Err()
}

// scaleBySampleWeight is TensorFlow's scale_losses_by_sample_weight with
// x, the loss, cast back to its type.
func scaleBySampleWeight(b *Builder, x, w tf.Output) (tf.Output, error) {
	xd, wd := staticDims(x), staticDims(w)
	if wd == nil || (xd == nil && len(wd) > 0) {
		return tf.Output{}, fmt.Errorf("SampleWeight of shape %v with perExample of shape %v: expected ranks the graph knows", w.Shape(), x.Shape())
	}
	squeeze, expand := len(wd) > 0 && len(wd)-len(xd) == 1, len(wd) > 0 && len(xd)-len(wd) == 1
	switch last := len(wd) - 1; {
	case squeeze && wd[last] >= 0 && wd[last] != 1:
		wd = nil // a last axis the graph knows is not 1 does not squeeze
	case squeeze:
		wd = wd[:last]
	case expand:
		wd = append(wd, 1)
	}
	if wd == nil || !mayBroadcast(xd, wd) {
		return tf.Output{}, fmt.Errorf("SampleWeight of shape %v with perExample of shape %v: expected shapes that broadcast once a last axis of size 1 is squeezed from or added to the weight", w.Shape(), x.Shape())
	}
	w32 := b.Cast(w, tf.Float)
	if squeeze {
		w32 = b.squeezeLast(w32)
	} else if expand {
		w32 = b.expandLast(w32)
	}
	return b.Cast(b.Mul(b.Cast(x, tf.Float), w32), x.DataType()), nil
}

// staticDims returns the dimensions of x the graph knows, -1 for an unknown
// one, and nil for an unknown rank.
func staticDims(x tf.Output) []int64 {
	d, err := x.Shape().ToSlice()
	if err != nil {
		return nil
	}
	return d
}

// mayBroadcast reports whether tensors of the dimensions a and b (-1 for
// an unknown one) may broadcast together.
func mayBroadcast(a, b []int64) bool {
	for i := 1; i <= min(len(a), len(b)); i++ {
		x, y := a[len(a)-i], b[len(b)-i]
		if x >= 0 && y >= 0 && x != y && x != 1 && y != 1 {
			return false
		}
	}
	return true
}

func newLossConfig(opts []LossOption) lossConfig {
	var c lossConfig
	for _, o := range opts {
		o(&c)
	}
	return c
}

// checkLoss returns an error when loss is not a floating-point tensor of
// a graph, or a sample weight is not a tensor.
func checkLoss(loss tf.Output, c lossConfig) error {
	if loss.Op == nil {
		return fmt.Errorf("the loss is a zero tf.Output; expected a floating-point tensor")
	}
	switch dt := loss.DataType(); dt {
	case tf.Half, tf.Bfloat16, tf.Float, tf.Double:
	default:
		return fmt.Errorf("the loss is %s; expected float16, bfloat16, float32 or float64", graphutil.DTypeName(dt))
	}
	if c.weighted && c.weight.Op == nil {
		return fmt.Errorf("SampleWeight is a zero tf.Output; expected a tensor")
	}
	return nil
}

// Reduction is how ReduceLoss reduces a loss tensor: a Keras loss's
// reduction argument.
type Reduction int

const (
	// SumOverBatchSize ("sum_over_batch_size", Keras 3's default) divides
	// the sum of every element by the number of elements, and by the
	// replicas in sync.
	SumOverBatchSize Reduction = iota
	// Sum ("sum") is the sum of every element, whatever the replicas.
	Sum
	// None ("none") reduces nothing.
	None
)

// String returns Keras's name of the reduction.
func (red Reduction) String() string {
	switch red {
	case SumOverBatchSize:
		return "sum_over_batch_size"
	case Sum:
		return "sum"
	case None:
		return "none"
	}
	return fmt.Sprintf("Reduction(%d)", int(red))
}

// ReduceLoss reduces values, a loss tensor, as a Keras 3 loss object with
// reduction red does in model.fit under a tf.distribute strategy
// (Loss.__call__: reduce_weighted_values, then scale_loss_for_distribution).
// It multiplies values by their SampleWeight, if any, cast to values' type
// and made the same rank Keras's way (only a last axis of size 1 is
// squeezed from one or added to the other), then:
//
//   - SumOverBatchSize sums every element, divides (divide_no_nan) by the
//     number of elements of the weighted tensor (not by the weights' sum)
//     and, when more than one replica is in sync, multiplies by
//     1/replicas, the replicas being ComputeAverageLoss's;
//   - Sum sums every element, unscaled, so that the replicas' losses add
//     up to the global batch's sum;
//   - None returns the weighted values.
//
// A scalar, or a tensor of static shape [0], comes back weighted but
// unreduced, as Keras returns it. The result has values' type (Keras
// computes in the loss's dtype, float32 unless set).
//
// Summed over the replicas of a step, as Minimize sums their gradients,
// SumOverBatchSize gives the mean of the replicas' means per element. For
// a per-example loss [batch] (and weights of its shape) it equals
// ComputeAverageLoss: the global batch's mean when every replica's batch
// has the same size, and with a partial last batch a mean that weighs the
// short replica's examples more, where Replica.AverageLoss is exact. For
// a per-token loss [batch, time] it is the mean per token, which
// ComputeAverageLoss gives only of the loss flattened to [batch·time].
func ReduceLoss(r strategy.Replica, values tf.Output, red Reduction, opts ...LossOption) (tf.Output, error) {
	c := newLossConfig(opts)
	if err := checkLoss(values, c); err != nil {
		return tf.Output{}, fmt.Errorf("nn.ReduceLoss: %w", err)
	}
	if red != SumOverBatchSize && red != Sum && red != None {
		return tf.Output{}, fmt.Errorf("nn.ReduceLoss: reduction %v: expected SumOverBatchSize, Sum or None", red)
	}
	if c.global {
		return tf.Output{}, fmt.Errorf("nn.ReduceLoss: GlobalBatchSize(%d): a Keras reduction divides by the loss's own size; expected no GlobalBatchSize (it is ComputeAverageLoss's)", c.globalBatch)
	}
	b := NewBuilder(r.Scope(), "reduce_loss")
	var out tf.Output
	err := graphutil.Safely(func() (err error) {
		out, err = reduceLoss(b, r, values, red, c)
		return err
	})
	if err != nil {
		return tf.Output{}, fmt.Errorf("nn.ReduceLoss %s: %w", red, err)
	}
	return out, nil
}

// reduceLoss builds ReduceLoss on b.
func reduceLoss(b *Builder, r strategy.Replica, x tf.Output, red Reduction, c lossConfig) (tf.Output, error) {
	dtype := x.DataType()
	if c.weighted {
		var err error
		if x, err = kerasWeighted(b, x, c.weight); err != nil {
			return tf.Output{}, err
		}
	}
	shape := x.Shape()
	if red == None || shape.NumDimensions() == 0 || (shape.NumDimensions() == 1 && shape.Size(0) == 0) {
		return x, b.Err()
	}
	loss := b.SumAll(x)
	if red == SumOverBatchSize {
		loss = b.DivNoNan(loss, b.Cast(b.numElements(x), dtype))
		if n := r.NumReplicasInSync(); n > 1 {
			loss = b.Mul(loss, b.Scalar(1/float64(n), dtype))
		}
	}
	return loss, b.Err()
}

// kerasWeighted returns x times w as Keras's reduce_weighted_values
// weighs a loss: w cast to x's type, then squeeze_or_expand_to_same_rank.
func kerasWeighted(b *Builder, x, w tf.Output) (tf.Output, error) {
	xs, ws := x.Shape(), w.Shape()
	xd, wd := staticDims(x), staticDims(w)
	if xd == nil || wd == nil {
		return tf.Output{}, fmt.Errorf("SampleWeight of shape %v with values of shape %v: expected ranks the graph knows", ws, xs)
	}
	w = b.Cast(w, x.DataType())
	switch xr, wr := len(xd), len(wd); {
	case xr == wr+1 && xd[xr-1] == 1 && wr == 1:
		w, wd = b.expandLast(w), append(wd, 1)
	case xr == wr+1 && xd[xr-1] == 1:
		x, xd = b.squeezeLast(x), xd[:xr-1]
	case wr == xr+1 && wd[wr-1] == 1 && xr == 1:
		x, xd = b.expandLast(x), append(xd, 1)
	case wr == xr+1 && wd[wr-1] == 1:
		w, wd = b.squeezeLast(w), wd[:wr-1]
	}
	if !mayBroadcast(xd, wd) {
		return tf.Output{}, fmt.Errorf("SampleWeight of shape %v with values of shape %v: expected shapes that broadcast once a last axis of size 1 is squeezed from or added to one of them", ws, xs)
	}
	return b.Mul(x, w), nil
}
