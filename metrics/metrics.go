// Package metrics keeps evaluation metrics the tf.distribute way, as Keras
// metrics do under a strategy: each metric is made of OnRead variables with
// AggregationSum, which every replica of a step adds its own counts to
// (Replica.AssignAdd, no communication while stepping) and which are summed
// over every replica of every worker when read outside a replica.
//
// Evaluate is Keras' model.evaluate: it resets metrics, runs an eval step
// that updates them over every batch of a distributed dataset and returns
// their results over the whole dataset. Each worker scores its own shard;
// since the counts are summed across workers, every example counts exactly
// once and every worker gets the same results.
//
// Under MultiWorkerMirrored, reading a metric (Result, Evaluate) and
// resetting it (Reset) are collective: every worker makes the same calls, in
// the same order. Under the parameter-server strategy, metrics update from
// the workers' functions and read on the chief (Result, with
// paramserver.Strategy as the Reader), but it has no Assign outside a
// function, so Reset and Evaluate are for the in-graph strategies only; and
// since the coordinator may run a function again when a worker fails, a
// count kept in a variable can count a batch twice there: score through
// the function's outputs instead.
package metrics

import (
	"context"
	"errors"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// Reader reads a variable outside any replica: every strategy.Strategy,
// and the parameter-server strategy.
type Reader interface {
	Value(ctx context.Context, v strategy.Variable) (*tf.Tensor, error)
}

// Assigner writes a variable outside any replica: the in-graph strategies
// (*onedevice.Strategy, mirrored, multiworker).
type Assigner interface {
	Assign(ctx context.Context, v strategy.Variable, value *tf.Tensor) error
}

// Metric is a value computed from OnRead variables that eval steps update.
type Metric interface {
	// Name returns the metric's name, the prefix of its variables' names.
	Name() string
	// Variables returns the variables the metric is kept in.
	Variables() []strategy.Variable
	// Result returns the metric over every update since the last reset,
	// across all replicas and workers.
	Result(ctx context.Context, s Reader) (float64, error)
}

// Sum is the sum of the values added to it: a count of examples, say.
type Sum struct {
	name string
	v    strategy.Variable
}

// NewSum creates a Sum named name in sc: one float64 scalar variable
// called name, OnRead with AggregationSum, not trainable, starting at 0.
// float64 keeps counts exact up to 2^53.
func NewSum(sc strategy.Scope, name string) (*Sum, error) {
	v, err := sc.Variable(name, tf.Double, nil, strategy.Zeros(),
		strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum), strategy.Trainable(false))
	if err != nil {
		return nil, fmt.Errorf("metrics: sum %q: %w", name, err)
	}
	return &Sum{name: name, v: v}, nil
}

// Name returns the metric's name.
func (m *Sum) Name() string { return m.name }

// Variables returns the one variable the sum is kept in.
func (m *Sum) Variables() []strategy.Variable { return []strategy.Variable{m.v} }

// Update adds the sum of every element of values (of any numeric type and
// shape; none adds 0) to the replica's part of m, inside a step.
func (m *Sum) Update(r strategy.Replica, values tf.Output) error {
	b := nn.NewBuilder(r.Scope(), "metric")
	if err := r.AssignAdd(m.v, b.SumAll(b.Cast(values, tf.Double))); err != nil {
		return fmt.Errorf("metrics: update %q: %w", m.name, err)
	}
	return nil
}

// Result returns the sum across all replicas and workers.
func (m *Sum) Result(ctx context.Context, s Reader) (float64, error) {
	t, err := s.Value(ctx, m.v)
	if err != nil {
		return 0, fmt.Errorf("metrics: read %q: %w", m.name, err)
	}
	f, ok := tensorutil.Value(t).(float64)
	if !ok {
		return 0, fmt.Errorf("metrics: read %q: value of type %T, expected a float64 scalar", m.name, tensorutil.Value(t))
	}
	return f, nil
}

// Mean is the mean of the values added to it: a total and a count.
type Mean struct {
	name         string
	total, count *Sum
}

// NewMean creates a Mean named name in sc, kept in the Sums
// "<name>/total" and "<name>/count".
func NewMean(sc strategy.Scope, name string) (*Mean, error) {
	total, err := NewSum(sc, name+"/total")
	if err != nil {
		return nil, err
	}
	count, err := NewSum(sc, name+"/count")
	if err != nil {
		return nil, err
	}
	return &Mean{name: name, total: total, count: count}, nil
}

// Name returns the metric's name.
func (m *Mean) Name() string { return m.name }

// Variables returns the total's and the count's variables.
func (m *Mean) Variables() []strategy.Variable {
	return []strategy.Variable{m.total.v, m.count.v}
}

// Update adds every element of values (of any numeric type and shape) to
// the mean, inside a step: their sum to the total, their number to the
// count.
func (m *Mean) Update(r strategy.Replica, values tf.Output) error {
	if err := m.total.Update(r, values); err != nil {
		return err
	}
	s := r.Scope().SubScope("metric_size")
	return m.count.Update(r, op.Size(s, values, op.SizeOutType(tf.Int64)))
}

// Result returns total/count across all replicas and workers; 0 when no
// value was added (Keras' divide_no_nan).
func (m *Mean) Result(ctx context.Context, s Reader) (float64, error) {
	total, err := m.total.Result(ctx, s)
	if err != nil {
		return 0, err
	}
	count, err := m.count.Result(ctx, s)
	if err != nil || count == 0 {
		return 0, err
	}
	return total / count, nil
}

// Accuracy is the share of examples a classifier gets right: Keras'
// SparseCategoricalAccuracy, a Mean of 1 per right example and 0 per wrong
// one.
type Accuracy struct {
	Mean
}

// NewAccuracy creates an Accuracy named name in sc (a Mean: see NewMean).
func NewAccuracy(sc strategy.Scope, name string) (*Accuracy, error) {
	m, err := NewMean(sc, name)
	if err != nil {
		return nil, err
	}
	return &Accuracy{Mean: *m}, nil
}

// Update scores a batch inside a step: logits [batch, classes] against
// labels [batch] (int32 or int64), a prediction being the class of the
// largest logit.
func (a *Accuracy) Update(r strategy.Replica, logits, labels tf.Output) error {
	return a.Mean.Update(r, nn.Correct(r.Scope().SubScope("metric_correct"), logits, labels))
}

// Reset sets every variable of ms to 0, outside any replica: between
// epochs, or before an evaluation. Under MultiWorkerMirrored every worker
// resets the same metrics.
func Reset(ctx context.Context, s Assigner, ms ...Metric) error {
	for _, m := range ms {
		for _, v := range m.Variables() {
			zero, err := zeros(v)
			if err != nil {
				return fmt.Errorf("metrics: reset %q: %w", m.Name(), err)
			}
			if err := s.Assign(ctx, v, zero); err != nil {
				return fmt.Errorf("metrics: reset %q: %w", m.Name(), err)
			}
		}
	}
	return nil
}

// zeros returns a float64 scalar 0 for v, the only kind of variable the
// metrics of this package keep.
func zeros(v strategy.Variable) (*tf.Tensor, error) {
	if v.DType() != tf.Double || len(v.Shape()) != 0 {
		return nil, fmt.Errorf("variable %q: dtype %s shape %v, expected a float64 scalar",
			v.Name(), graphutil.DTypeName(v.DType()), v.Shape())
	}
	return tf.NewTensor(float64(0))
}

// ErrNoAssign is returned by Evaluate for a strategy that cannot write a
// variable outside a replica, and so cannot reset the metrics.
var ErrNoAssign = errors.New("metrics: the strategy cannot reset metrics: it has no Assign outside a replica")

// Evaluate is Keras' model.evaluate: it resets ms, runs step with s on
// every batch of dist (each worker on its own shard, and its steps update
// ms), and returns each metric's result over the whole dataset, by name.
// s must be able to reset the metrics (an in-graph strategy: see
// Assigner). Under MultiWorkerMirrored every worker calls Evaluate with the
// same metrics and gets the same results; a pass whose workers' inputs end
// at different steps (FILE sharding, DistributeDatasetsFromFunction) ends
// on every worker together, the ones that ran out scoring empty batches.
func Evaluate(ctx context.Context, s strategy.Strategy, step strategy.Step, dist *dataset.Distributed, ms ...Metric) (map[string]float64, error) {
	a, ok := s.(Assigner)
	if !ok {
		return nil, fmt.Errorf("%w (strategy of type %T)", ErrNoAssign, s)
	}
	if err := Reset(ctx, a, ms...); err != nil {
		return nil, err
	}
	n := 0
	for b, err := range dist.All(ctx) {
		if err != nil {
			return nil, fmt.Errorf("metrics: evaluate: batch %d: %w", n, err)
		}
		if _, err := s.Run(ctx, step, b); err != nil {
			return nil, fmt.Errorf("metrics: evaluate: batch %d: %w", n, err)
		}
		n++
	}
	res := make(map[string]float64, len(ms))
	for _, m := range ms {
		v, err := m.Result(ctx, s)
		if err != nil {
			return nil, err
		}
		res[m.Name()] = v
	}
	return res, nil
}
