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

	"github.com/tfdist/tfdist/strategy"
)

// Strategy is the one-device strategy: the in-graph engine with one
// replica. Its methods are those of the strategy.Strategy interface, plus
// State for checkpoints and the engine's reads and writes of variables
// (Values, Assign, Copies).
type Strategy struct {
	*engine
}

// engine names the embedded engine without exporting it as a field.
type engine = strategy.InGraph

// Option configures the strategy.
type Option func(*strategy.Config)

// WithLogger sets the strategy's logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(c *strategy.Config) { c.Logger = l } }

// WithDevice runs the strategy on device, spelled in full (default this
// process's CPU:0, strategy.LocalCPU(0)).
func WithDevice(device string) Option {
	return func(c *strategy.Config) { c.Devices = []string{device} }
}

// New returns a one-device strategy. Each is an engine of its own, with
// its own graph and session.
func New(opts ...Option) (*Strategy, error) {
	cfg := strategy.Config{Name: "default", Devices: []string{strategy.LocalCPU(0)}, CrossDeviceOps: strategy.ReductionToOneDevice{}}
	for _, o := range opts {
		o(&cfg)
	}
	e, err := strategy.NewInGraph(cfg)
	if err != nil {
		return nil, err
	}
	return &Strategy{engine: e}, nil
}
