package nn

import (
	"fmt"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// LayerNorm normalises each example over one axis to mean 0 and
// variance 1, then scales by gamma and shifts by beta, one of each per
// element of that axis (Keras' LayerNormalization).
type LayerNorm struct {
	// Axis is the axis normalised over, numbered as Keras numbers it:
	// 1 is the first after the batch, -1 (and the zero value) the last.
	Axis    int
	Epsilon float64 // default 1e-3
}

// Kind implements Spec.
func (LayerNorm) Kind() string { return "layer_norm" }

// Build implements Spec.
func (l LayerNorm) Build(sc strategy.Scope, name string, in []int64, _ int64) (Layer, []int64, error) {
	if len(in) == 0 {
		return nil, nil, fmt.Errorf("LayerNorm: input shape [-1], expected at least one axis after the batch")
	}
	rank := len(in) + 1
	axis := l.Axis
	if axis == 0 {
		axis = -1
	}
	if axis < 0 {
		axis += rank
	}
	shape := append([]int64{-1}, in...)
	if axis < 1 || axis >= rank {
		return nil, nil, fmt.Errorf("LayerNorm: Axis %d for input shape %v, expected 1 to %d or -%d to -1 (axis 0 is the batch)", l.Axis, shape, rank-1, rank-1)
	}
	if in[axis-1] < 0 {
		return nil, nil, fmt.Errorf("LayerNorm: input shape %v, expected a known size on axis %d", shape, axis)
	}
	gamma, beta, err := scaleShift(sc, name, in[axis-1])
	if err != nil {
		return nil, nil, err
	}
	var bshape []int64 // gamma and beta broadcast along the axes after Axis
	if axis < rank-1 {
		bshape = append([]int64{in[axis-1]}, slices.Repeat([]int64{1}, rank-1-axis)...)
	}
	return &layerNorm{gamma: gamma, beta: beta, in: in, axis: int32(axis), bshape: bshape, eps: orDefault(l.Epsilon, 1e-3)}, in, nil
}

type layerNorm struct {
	gamma, beta strategy.Variable
	in          []int64
	axis        int32
	bshape      []int64
	eps         float64
}

func (l *layerNorm) Vars() []strategy.Variable { return []strategy.Variable{l.gamma, l.beta} }

func (l *layerNorm) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "layer_norm")
	return inFloat32(b, x, func(x tf.Output) (tf.Output, error) {
		mean := b.Mean(x, true, l.axis)
		variance := b.Mean(b.Square(b.Sub(x, mean)), true, l.axis)
		return normalize(r, b, x, mean, variance, l.eps, l.gamma, l.beta, l.bshape)
	})
}

// BatchNorm normalises each feature (the last axis) over the batch and
// the other axes: while training with the batch's statistics, which also
// move the moving mean and variance (mean ← m·mean + (1-m)·batch mean);
// at inference with the moving statistics. The moving statistics are
// OnRead variables with Mean aggregation: each replica moves its own copy,
// and a checkpoint or Value takes their mean.
//
// Synchronized computes the batch statistics over the global batch, all
// replicas and workers together (Keras' synchronized=True), with one
// all-reduce of every feature's sum, sum of squares and count per step,
// so N replicas normalise exactly as one device on the global batch; the
// gradient passes back through that all-reduce (see
// strategy.Replica.Gradients), so they also train as one device
// does. A strategy whose replicas do not run in sync (the
// parameter-server strategy) refuses it when the step is built.
type BatchNorm struct {
	Momentum     float64 // default 0.99
	Epsilon      float64 // default 1e-3
	Synchronized bool
}

// Kind implements Spec.
func (BatchNorm) Kind() string { return "batch_norm" }

// Build implements Spec.
func (bn BatchNorm) Build(sc strategy.Scope, name string, in []int64, _ int64) (Layer, []int64, error) {
	if len(in) == 0 {
		return nil, nil, fmt.Errorf("BatchNorm: input shape [-1], expected at least one feature axis")
	}
	if bn.Momentum < 0 || bn.Momentum >= 1 {
		return nil, nil, fmt.Errorf("BatchNorm: Momentum %v, expected 0 <= Momentum < 1 (0: the default 0.99)", bn.Momentum)
	}
	c := in[len(in)-1]
	gamma, beta, err := scaleShift(sc, name, c)
	if err != nil {
		return nil, nil, err
	}
	moving := []strategy.VariableOption{strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationMean)}
	mean, err := sc.Variable(name+"/moving_mean", tf.Float, []int64{c}, strategy.Zeros(), moving...)
	if err != nil {
		return nil, nil, err
	}
	variance, err := sc.Variable(name+"/moving_variance", tf.Float, []int64{c}, Ones(), moving...)
	if err != nil {
		return nil, nil, err
	}
	return &batchNorm{gamma: gamma, beta: beta, mean: mean, variance: variance, in: in, sync: bn.Synchronized,
		momentum: orDefault(bn.Momentum, 0.99), eps: orDefault(bn.Epsilon, 1e-3)}, in, nil
}

type batchNorm struct {
	gamma, beta, mean, variance strategy.Variable
	in                          []int64
	sync                        bool
	momentum, eps               float64
}

func (l *batchNorm) Vars() []strategy.Variable { return []strategy.Variable{l.gamma, l.beta} }

func (l *batchNorm) Apply(r strategy.Replica, x tf.Output, training bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "batch_norm")
	return inFloat32(b, x, func(x tf.Output) (tf.Output, error) { return l.apply(r, b, x, training) })
}

func (l *batchNorm) apply(r strategy.Replica, b *Builder, x tf.Output, training bool) (tf.Output, error) {
	if !training {
		moving, err := readAll(r, l.mean, l.variance)
		if err != nil {
			return tf.Output{}, err
		}
		return normalize(r, b, x, moving[0], moving[1], l.eps, l.gamma, l.beta, nil)
	}
	mean, variance, n, err := l.batchStats(r, b, x)
	if err != nil {
		return tf.Output{}, err
	}
	// A batch of no examples (a padding step) leaves the statistics as
	// they are.
	seen := b.Cast(op.Greater(b.Op(), n, b.Scalar(0, tf.Float)), tf.Float)
	for _, mv := range []struct {
		v     strategy.Variable
		batch tf.Output
	}{{l.mean, mean}, {l.variance, variance}} {
		old, err := r.Read(mv.v)
		if err != nil {
			return tf.Output{}, err
		}
		stat := op.StopGradient(b.Op(), mv.batch)
		next := b.Add(b.Mul(old, b.Scalar(l.momentum, tf.Float)), b.Mul(stat, b.Scalar(1-l.momentum, tf.Float)))
		next = b.Add(old, b.Mul(b.Sub(next, old), seen))
		if err := r.Assign(mv.v, next); err != nil {
			return tf.Output{}, err
		}
	}
	return normalize(r, b, x, mean, variance, l.eps, l.gamma, l.beta, nil)
}

// batchStats returns every feature's mean and (biased) variance over the
// batch and every axis but the last: this replica's batch, or the global
// batch when synchronized.
func (l *batchNorm) batchStats(r strategy.Replica, b *Builder, x tf.Output) (mean, variance, n tf.Output, err error) {
	axes := make([]int32, len(l.in))
	for i := range axes {
		axes[i] = int32(i)
	}
	sum, sumsq := b.Sum(x, false, axes...), b.Sum(b.Square(x), false, axes...)
	n = b.Mul(b.Count(x, tf.Float), b.Scalar(float64(prod(l.in[:len(l.in)-1])), tf.Float))
	if l.sync {
		c := l.in[len(l.in)-1]
		local := op.ConcatV2(b.Op(), []tf.Output{sum, sumsq, b.Reshape(n, 1)}, b.Const(int32(0)))
		global, err := r.AllReduce(strategy.Sum, local)
		if err != nil {
			return tf.Output{}, tf.Output{}, tf.Output{}, fmt.Errorf("BatchNorm synchronized: %w", err)
		}
		sum = op.Slice(b.Op(), global, b.Const([]int32{0}), b.Const([]int32{int32(c)}))
		sumsq = op.Slice(b.Op(), global, b.Const([]int32{int32(c)}), b.Const([]int32{int32(c)}))
		n = b.Reshape(op.Slice(b.Op(), global, b.Const([]int32{int32(2 * c)}), b.Const([]int32{1})))
	}
	mean = op.DivNoNan(b.Op(), sum, n)
	variance = b.Sub(op.DivNoNan(b.Op(), sumsq, n), b.Square(mean))
	return mean, variance, n, b.Err()
}

// inFloat32 returns fn(x), computed in float32 when x is a 16-bit type
// and cast back to it: under mixed precision, normalisation layers compute
// their statistics and variables in float32, as Keras' do.
func inFloat32(b *Builder, x tf.Output, fn func(x tf.Output) (tf.Output, error)) (tf.Output, error) {
	if !isHalf(x.DataType()) {
		return fn(x)
	}
	y, err := fn(b.Cast(x, tf.Float))
	if err != nil {
		return tf.Output{}, err
	}
	return b.Cast(y, x.DataType()), b.Err()
}

// normalize returns (x - mean)/sqrt(variance + eps)·gamma + beta, gamma
// and beta reshaped to bshape unless it is nil.
func normalize(r strategy.Replica, b *Builder, x, mean, variance tf.Output, eps float64, gammaVar, betaVar strategy.Variable, bshape []int64) (tf.Output, error) {
	gb, err := readAll(r, gammaVar, betaVar)
	if err != nil {
		return tf.Output{}, err
	}
	if bshape != nil {
		gb[0], gb[1] = b.Reshape(gb[0], bshape...), b.Reshape(gb[1], bshape...)
	}
	inv := b.Mul(b.Rsqrt(b.Add(variance, b.Scalar(eps, tf.Float))), gb[0])
	return b.Add(b.Mul(b.Sub(x, mean), inv), gb[1]), b.Err()
}

// scaleShift creates a normalisation's gamma (ones) and beta (zeros).
func scaleShift(sc strategy.Scope, name string, c int64) (gamma, beta strategy.Variable, err error) {
	if gamma, err = sc.Variable(name+"/gamma", tf.Float, []int64{c}, Ones()); err != nil {
		return nil, nil, err
	}
	beta, err = sc.Variable(name+"/beta", tf.Float, []int64{c}, strategy.Zeros())
	return gamma, beta, err
}

func orDefault(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return v
}
