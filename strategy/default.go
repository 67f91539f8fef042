package strategy

import (
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// DefaultOption configures the default strategy.
type DefaultOption func(*Config)

// WithLogger sets the default strategy's logger.
func WithLogger(l *zap.Logger) DefaultOption { return func(c *Config) { c.Logger = l } }

// WithDevice runs the default strategy on device (default /device:CPU:0 of
// the local process, spelled in full).
func WithDevice(device string) DefaultOption {
	return func(c *Config) { c.Devices = []string{device} }
}

// LocalCPU returns the full name of this process's CPU device i.
func LocalCPU(i int) string {
	return tfrt.DeviceSpec{Job: "localhost", Replica: 0, Task: 0, Type: "CPU", Index: i}.String()
}

// Default returns the default strategy: one replica on one device, no
// distribution, so the same program runs with or without a distribution
// strategy. It is a new engine each call (its own graph and session).
func Default(opts ...DefaultOption) (*InGraph, error) {
	cfg := Config{Name: "default", Devices: []string{LocalCPU(0)}, CrossDeviceOps: ReductionToOneDevice{}}
	for _, o := range opts {
		o(&cfg)
	}
	return NewInGraph(cfg)
}
