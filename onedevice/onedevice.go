// Package onedevice is the strategy of one device (tf.distribute's
// OneDeviceStrategy, and the default strategy of a program that does not
// distribute): one replica, no communication, so the same training program
// runs with or without distribution, and N replicas of another strategy
// can be checked against it.
//
//	s, err := onedevice.New() // this process's CPU:0
//	s, err := onedevice.New(onedevice.WithDevice("/job:localhost/replica:0/task:0/device:GPU:0"))
package onedevice

import (
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/strategy"
)

// Strategy is the one-device strategy: tfdist's in-graph engine with one
// replica. Its methods are those of the strategy.Strategy interface, plus
// State for checkpoints, RunReplicas (a step on explicit inputs) and the
// engine's reads and writes of variables (Values, Copies, Assign, Err).
type Strategy struct {
	*engine
}

// engine names the embedded engine without exporting it as a field.
type engine = ingraph.Engine

// Option configures the strategy.
type Option func(*config)

type config struct {
	logger *zap.Logger
	device string
	shards int
}

// WithLogger sets the strategy's logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.logger = l } }

// WithDevice runs the strategy on device, spelled in full (default this
// process's CPU:0, strategy.LocalCPU(0)).
func WithDevice(device string) Option { return func(c *config) { c.device = device } }

// WithDeterministic makes training topology-invariant: the strategy runs
// virtualShards replicas in sync on its device in one step, each its own
// kernels over its part of the global batch, all sharing the device's copy
// of every variable, and sums their gradients along one tree. Training
// then ends with the same bits as under the mirrored and multi-worker
// strategies with the same number of virtual shards, on any number of
// devices or workers that divides it. virtualShards must be a power of
// two. The shards' kernels are its price: a step of several shards of a
// few examples each costs their dispatch, of tens or more examples little
// (see docs/benchmarks.md). See docs/reproducibility.md.
func WithDeterministic(virtualShards int) Option { return func(c *config) { c.shards = virtualShards } }

// New returns a one-device strategy. Each is an engine of its own, with
// its own graph and session.
func New(opts ...Option) (*Strategy, error) {
	c := config{device: strategy.LocalCPU(0)}
	for _, o := range opts {
		o(&c)
	}
	e, err := ingraph.New(ingraph.Config{Name: "default", Devices: []string{c.device}, Logger: c.logger,
		CrossDeviceOps: ingraph.ReductionToOneDevice{InTreeOrder: c.shards != 0}, VirtualShards: c.shards})
	if err != nil {
		return nil, err
	}
	return &Strategy{engine: e}, nil
}
