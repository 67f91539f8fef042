// Package distribute makes the synchronous strategy a program's flags
// name, so that one training program runs on one device, on every device
// of a machine, or as one worker of many under `tfdist launch`:
//
//	var cfg distribute.Config
//	cfg.RegisterFlags(flag.CommandLine)
//	flag.Parse()
//	s, err := distribute.New(ctx, cfg)
//
// The parameter-server strategy, whose coordinator schedules steps
// instead of running them, is made with paramserver.New.
package distribute

import (
	"context"
	"flag"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/role"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// Config names a strategy and its devices.
type Config struct {
	// Strategy is "default" (one device), "mirrored" (the devices of this
	// machine) or "multiworker" (this machine's devices, one worker of the
	// cluster TF_CONFIG describes).
	Strategy string
	// Devices is the number of logical CPU devices of each process under
	// mirrored and multiworker; 0 takes every GPU under mirrored (one CPU
	// device where there is none) and one CPU under multiworker.
	Devices int
	// CollectiveTimeout bounds every collective under multiworker; 0
	// keeps the strategy's default.
	CollectiveTimeout time.Duration
	// Logger receives the strategy's logs; nil discards them.
	Logger *zap.Logger
}

// Names lists the strategies New makes.
var Names = []string{"default", "mirrored", "multiworker"}

// RegisterFlags registers -strategy, -devices and -collective-timeout on
// fs, with c's values as their defaults ("default" when c.Strategy is
// empty).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.Strategy == "" {
		c.Strategy = "default"
	}
	fs.StringVar(&c.Strategy, "strategy", c.Strategy, "distribution strategy: default, mirrored or multiworker (TF_CONFIG names the cluster)")
	fs.IntVar(&c.Devices, "devices", c.Devices, "logical CPU devices per process under mirrored and multiworker (0: every GPU under mirrored)")
	fs.DurationVar(&c.CollectiveTimeout, "collective-timeout", c.CollectiveTimeout, "bound on each collective under multiworker (0: the default)")
}

// IsChief reports whether this process is the chief of s's job, the one
// that writes what only one worker should: a multiworker task as its
// cluster says, any strategy of one process always. It is the rule by
// which checkpoint.NewManager and savedmodel.Export decide who writes.
func IsChief(s strategy.Strategy) bool { return role.IsChief(s) }

// New makes the strategy c names.
func New(ctx context.Context, c Config) (strategy.Strategy, error) {
	if c.Devices < 0 {
		return nil, fmt.Errorf("distribute: Devices %d, expected 0 or more", c.Devices)
	}
	log := c.Logger
	if log == nil {
		log = zap.NewNop()
	}
	switch c.Strategy {
	case "default", "":
		if c.Devices > 1 {
			return nil, fmt.Errorf("distribute: strategy default runs one replica; Devices %d asks for more (use mirrored)", c.Devices)
		}
		return made(strategy.Default())
	case "mirrored":
		opts := []mirrored.Option{mirrored.WithLogger(log)}
		if c.Devices > 0 {
			opts = append(opts, mirrored.WithLogicalCPUs(c.Devices))
		}
		return made(mirrored.New(opts...))
	case "multiworker":
		opts := []multiworker.Option{multiworker.WithLogger(log), multiworker.WithLogicalCPUs(max(c.Devices, 1))}
		if c.CollectiveTimeout > 0 {
			opts = append(opts, multiworker.WithCollectiveTimeout(c.CollectiveTimeout))
		}
		return made(multiworker.New(ctx, opts...))
	}
	return nil, fmt.Errorf("distribute: strategy %q, expected one of %v", c.Strategy, Names)
}

// made returns s as a strategy.Strategy, nil (not a nil *S) on an error.
func made[S strategy.Strategy](s S, err error) (strategy.Strategy, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}
