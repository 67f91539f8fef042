package train

import (
	"fmt"

	"github.com/tfdist/tfdist/strategy"
)

// Option configures Compile.
type Option func(*config)

type config struct {
	metrics   []Metric
	trainStep TrainStep
	minimize  []strategy.MinimizeOption
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c
}

// check refuses metrics without a name or named alike.
func (c config) check() error {
	seen := map[string]bool{"loss": true}
	for i, m := range c.metrics {
		if m == nil {
			return fmt.Errorf("train: Compile: metric %d is nil", i)
		}
		name := m.Name()
		if name == "" || seen[name] {
			return fmt.Errorf("train: Compile: metric %d named %q, expected a name of its own (not \"loss\", not another metric's: see NamedMetric)", i, name)
		}
		seen[name] = true
	}
	return nil
}

// WithMetrics adds metrics that Fit and Evaluate report besides the loss.
func WithMetrics(ms ...Metric) Option {
	return func(c *config) { c.metrics = append(c.metrics, ms...) }
}

// WithTrainStep replaces the training step (predict, loss, minimize) by
// fn, as a Keras user overrides train_step.
func WithTrainStep(fn TrainStep) Option { return func(c *config) { c.trainStep = fn } }

// WithMinimizeOptions passes opts to every Minimize of the training step:
// strategy.WithSparseOptimizer for embeddings on parameter servers,
// strategy.WithAccumulation, …. Under WithAccumulation(k) each batch is
// still a step; the step that applies an update, every k-th, logs the k
// batches it accumulated, and the steps between, which only accumulate
// gradients without communicating, log nothing.
func WithMinimizeOptions(opts ...strategy.MinimizeOption) Option {
	return func(c *config) { c.minimize = append(c.minimize, opts...) }
}
