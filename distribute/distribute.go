// Package distribute makes the strategy a program's flags name, so that
// one training program runs on one device, on every device of a machine,
// as one worker of many under `tfdist launch`, or as a task of a
// parameter-server cluster:
//
//	var cfg distribute.Config
//	cfg.RegisterFlags(flag.CommandLine)
//	flag.Parse()
//	s, err := distribute.Open(ctx, cfg) // for train.Compile; New for a loop of one's own
//
// Open makes every strategy, the parameter-server strategy ("ps")
// included, for a program that trains with package train, whose Fit lets
// the coordinator schedule the steps. New makes the synchronous ones as
// strategy.Strategy, for a program that runs its steps itself.
package distribute

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/role"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// Config names a strategy and its devices.
type Config struct {
	// Strategy is "default" (one device), "mirrored" (the devices of this
	// machine), "multiworker" (this machine's devices, one worker of the
	// cluster TF_CONFIG describes) or, with Open only, "ps" (a task of the
	// parameter-server cluster TF_CONFIG describes).
	Strategy string
	// Devices is the number of logical CPU devices of each process under
	// mirrored and multiworker; 0 takes every GPU of the process (one CPU
	// device where there is none).
	Devices int
	// CollectiveTimeout bounds every collective under multiworker; 0
	// keeps the strategy's default.
	CollectiveTimeout time.Duration
	// Deterministic, when positive, is the number of virtual shards of
	// topology-invariant training (the strategies' WithDeterministic): the
	// same bits under default, mirrored and multiworker on any number of
	// devices and workers that divides it. 0 is off; ps refuses it.
	Deterministic int
	// Logger receives the strategy's logs; nil discards them.
	Logger *zap.Logger
	// Host, under elastic, is the address the other workers reach this
	// one at; empty takes $TFDIST_HOST, else 127.0.0.1.
	Host string
	// Leave, under elastic, makes this worker leave the job gracefully at
	// the next step boundary once it is closed (close it on SIGTERM); the
	// others go on without it.
	Leave <-chan struct{}
	// LocalSGD, under multiworker or elastic, trains with local SGD or DiLoCo
	// (multiworker.WithLocalSGD); nil trains in sync every step.
	LocalSGD *multiworker.LocalSGD
	// Compression, under multiworker or elastic, is how the gradients
	// travel between workers (multiworker.WithCompression), or with
	// LocalSGD the outer gradient (LocalSGD.Compression) and the warm-up's
	// gradients.
	Compression multiworker.Compression
	// ZeRO, under multiworker, shards the optimizer state across the
	// workers at stage 1 or 2 (multiworker.WithZeRO); 0 keeps it whole.
	ZeRO int

	localSGDFlags []localSGDFlag // -local-sgd-warmup, -fragments, -overlap
}

// localSGDFlag is a flag that sets a LocalSGD field, applied once every
// flag is parsed, whatever their order.
type localSGDFlag struct {
	name string
	n    int
	set  func(*multiworker.LocalSGD, int)
}

// localSGDInt returns the Func of flag name, a count of steps or
// fragments, 0 or more, that set applies to the LocalSGD options.
func (c *Config) localSGDInt(name string, set func(*multiworker.LocalSGD, int)) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("-%s %q: expected a whole number, 0 or more", name, v)
		}
		c.localSGDFlags = append(c.localSGDFlags, localSGDFlag{name: name, n: n, set: set})
		return nil
	}
}

// Names lists the strategies Open makes; New makes all but "ps", and Run
// every one and "elastic".
var Names = []string{"default", "mirrored", "multiworker", "ps"}

// RegisterFlags registers -strategy, -devices and -collective-timeout on
// fs, with c's values as their defaults ("default" when c.Strategy is
// empty).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.Strategy == "" {
		c.Strategy = "default"
	}
	fs.StringVar(&c.Strategy, "strategy", c.Strategy, "distribution strategy: default, mirrored, multiworker, ps (TF_CONFIG names the cluster) or elastic (tfdist launch --elastic)")
	fs.IntVar(&c.Devices, "devices", c.Devices, "logical CPU devices per process under mirrored and multiworker (0: every GPU, else one CPU)")
	fs.DurationVar(&c.CollectiveTimeout, "collective-timeout", c.CollectiveTimeout, "bound on each collective under multiworker (0: the default)")
	fs.IntVar(&c.Deterministic, "deterministic", c.Deterministic,
		"virtual shards, a power of two, for the same model bit for bit on any number of devices and workers dividing it (0: off)")
	fs.Func("local-sgd", "under multiworker or elastic, synchronise every `H` training steps by averaging the workers' parameters (local SGD)", c.localSGDFlag("local-sgd", multiworker.LocalSGD{}))
	fs.Func("diloco", "under multiworker or elastic, synchronise every `H` training steps with DiLoCo's outer Nesterov momentum (rate 0.7, momentum 0.9)",
		c.localSGDFlag("diloco", multiworker.LocalSGD{OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true}))
	fs.Func("local-sgd-warmup", "with -local-sgd or -diloco, make the first `N` training steps synchronous, then synchronise every H (post-local SGD's warm-up)",
		c.localSGDInt("local-sgd-warmup", func(l *multiworker.LocalSGD, n int) { l.WarmupSteps = n }))
	fs.Func("fragments", "with -local-sgd or -diloco, synchronise the parameters in `P` fragments in turn (Streaming DiLoCo)",
		c.localSGDInt("fragments", func(l *multiworker.LocalSGD, n int) { l.Fragments = n }))
	fs.Func("overlap", "with -local-sgd or -diloco, all-reduce each synchronisation while training `T` more steps (Streaming DiLoCo's overlap; its parameters then mixed half and half with the workers' own)",
		c.localSGDInt("overlap", func(l *multiworker.LocalSGD, n int) {
			l.Overlap = n
			if n > 0 {
				l.Mix = 0.5
			}
		}))
	fs.IntVar(&c.ZeRO, "zero", c.ZeRO, "under multiworker, shard the optimizer state across the workers (ZeRO `stage` 1, or 2 to shard accumulated gradients too); 0 keeps it whole")
	fs.Func("compression", "under multiworker or elastic, how gradients travel between workers: none, fp16, bf16, int8 or topk(`ratio`); with -local-sgd or -diloco, the outer gradient and the warm-up's gradients: none, fp16, bf16 or int8",
		func(v string) (err error) {
			c.Compression, err = multiworker.ParseCompression(v)
			return err
		})
}

// localSGDFlag sets c.LocalSGD to l synchronising every H steps, from the
// value of flag name.
func (c *Config) localSGDFlag(name string, l multiworker.LocalSGD) func(string) error {
	return func(v string) error {
		h, err := strconv.Atoi(v)
		switch {
		case err != nil || h < 1:
			return fmt.Errorf("-%s %q: expected a number of training steps, 1 or more", name, v)
		case c.LocalSGD != nil:
			return fmt.Errorf("-%s: give -local-sgd or -diloco, once", name)
		}
		l.Steps = h
		c.LocalSGD = &l
		return nil
	}
}

// IsChief reports whether this process is the chief of s's job, the one
// that writes what only one worker should: a multiworker task as its
// cluster says, any strategy of one process always. It is the rule by
// which checkpoint.NewManager and savedmodel.Export decide who writes.
func IsChief(s strategy.Strategy) bool { return role.IsChief(s) }

// NumReplicas returns the replicas whose steps train s's model: the
// replicas in sync of a synchronous strategy, or the workers of the
// parameter-server strategy, one replica each.
func NumReplicas(s Strategy) int {
	switch s := s.(type) {
	case *paramserver.Strategy:
		return s.NumWorkers()
	case strategy.Strategy:
		return s.NumReplicasInSync()
	}
	return 1
}

// Strategy is a strategy Open makes: a strategy.Strategy, or the
// parameter-server strategy of the chief (*paramserver.Strategy). Both
// are what train.Compile takes.
type Strategy interface {
	Scope(fn func(strategy.Scope) error) error
	Variables() []strategy.Variable
	Close() error
}

// Open makes the strategy c names, "ps" included. Under "ps" it joins the
// cluster TF_CONFIG describes: on the chief it returns the
// parameter-server strategy, whose coordinator schedules the steps; on a
// ps or worker task it serves the cluster until the job ends and returns
// an error wrapping paramserver.ErrNotChief, on which the program should
// exit successfully.
func Open(ctx context.Context, c Config) (Strategy, error) {
	if c.Strategy != "ps" { // New refuses elastic
		return New(ctx, c)
	}
	if c.Devices > 1 {
		return nil, fmt.Errorf("distribute: strategy ps runs each step on one device of a worker; Devices %d asks for more", c.Devices)
	}
	if c.Deterministic != 0 {
		return nil, fmt.Errorf("distribute: strategy ps applies each worker's updates as they come, in no fixed order; Deterministic %d needs a synchronous strategy (default, mirrored or multiworker)", c.Deterministic)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	s, err := paramserver.New(ctx, nil, paramserver.WithLogger(logger(c)))
	if err != nil {
		return nil, err
	}
	return s, nil
}

func logger(c Config) *zap.Logger {
	if c.Logger == nil {
		return zap.NewNop()
	}
	return c.Logger
}

// New makes the synchronous strategy c names.
func New(ctx context.Context, c Config) (strategy.Strategy, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	log := logger(c)
	switch c.Strategy {
	case "default", "":
		if c.Devices > 1 {
			return nil, fmt.Errorf("distribute: strategy default runs one replica; Devices %d asks for more (use mirrored)", c.Devices)
		}
		return made(onedevice.New(onedevice.WithLogger(log), onedevice.WithDeterministic(c.Deterministic)))
	case "mirrored":
		opts := []mirrored.Option{mirrored.WithLogger(log), mirrored.WithDeterministic(c.Deterministic)}
		if c.Devices > 0 {
			opts = append(opts, mirrored.WithLogicalCPUs(c.Devices))
		}
		return made(mirrored.New(opts...))
	case "multiworker":
		return made(multiworker.New(ctx, multiworkerOptions(c)...))
	case "elastic":
		return nil, errors.New("distribute: strategy elastic makes a strategy for each membership of the job: train with Run")
	case "ps":
		return nil, fmt.Errorf("distribute: strategy ps: its coordinator schedules the steps instead of running them; make it with Open and train with package train, or use paramserver directly")
	}
	return nil, fmt.Errorf("distribute: strategy %q, expected one of %v (or elastic, which Run makes)", c.Strategy, Names)
}

// check refuses a negative device count, and local SGD or compression
// but under multiworker or elastic.
func (c Config) check() error {
	multi := c.Strategy == "multiworker" || c.Strategy == "elastic"
	if c.LocalSGD != nil && !multi {
		return fmt.Errorf("distribute: local SGD (-local-sgd, -diloco) under strategy %q: expected multiworker or elastic, whose workers synchronise", c.Strategy)
	}
	if c.Compression != multiworker.None && !multi {
		return fmt.Errorf("distribute: Compression %v (-compression) under strategy %q: expected multiworker or elastic, whose gradients cross between workers", c.Compression, c.Strategy)
	}
	if c.ZeRO != 0 && c.Strategy != "multiworker" {
		return fmt.Errorf("distribute: ZeRO %d (-zero) under strategy %q: the optimizer state is sharded across the worker processes of multiworker; use multiworker (tfdist launch --workers N)", c.ZeRO, c.Strategy)
	}
	if len(c.localSGDFlags) > 0 && c.LocalSGD == nil {
		f := c.localSGDFlags[0]
		return fmt.Errorf("distribute: -%s %d without -local-sgd or -diloco: expected one of them, whose synchronisations it sets", f.name, f.n)
	}
	if c.Devices < 0 {
		return fmt.Errorf("distribute: Devices %d, expected 0 or more", c.Devices)
	}
	return nil
}

// multiworkerOptions are the options of c's multiworker strategies.
func multiworkerOptions(c Config) []multiworker.Option {
	opts := []multiworker.Option{multiworker.WithLogger(logger(c)), multiworker.WithDeterministic(c.Deterministic)}
	if c.Devices > 0 {
		opts = append(opts, multiworker.WithLogicalCPUs(c.Devices))
	}
	if c.CollectiveTimeout > 0 {
		opts = append(opts, multiworker.WithCollectiveTimeout(c.CollectiveTimeout))
	}
	switch {
	case c.LocalSGD != nil:
		l := *c.LocalSGD
		if c.Compression != multiworker.None {
			l.Compression = c.Compression
		}
		for _, f := range c.localSGDFlags {
			f.set(&l, f.n)
		}
		opts = append(opts, multiworker.WithLocalSGD(l))
		if c.Compression != multiworker.None && l.WarmupSteps > 0 { // the warm-up's gradients too
			opts = append(opts, multiworker.WithCompression(c.Compression))
		}
	case c.Compression != multiworker.None:
		opts = append(opts, multiworker.WithCompression(c.Compression))
	}
	if c.ZeRO != 0 {
		opts = append(opts, multiworker.WithZeRO(c.ZeRO))
	}
	return opts
}

// made returns s as a strategy.Strategy, nil (not a nil *S) on an error.
func made[S strategy.Strategy](s S, err error) (strategy.Strategy, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}
