// Package mirrored is MirroredStrategy: synchronous data parallelism across
// the devices of one machine. Every variable has one copy per device; each
// step runs the replica function on every device at once (one graph, one
// Session.Run) and sums the gradients across devices before every copy
// applies the same update, so the copies stay identical.
//
// By default it uses every GPU of the machine, else CPU:0. WithLogicalCPUs(n)
// splits the CPU into n logical devices: how tfdist tests and demonstrates
// multi-device training on machines without accelerators.
//
// Gradients are reduced with NCCL when every device is a GPU and by
// ReductionToOneDevice otherwise; small gradients are packed into buffers of
// WithBytesPerPack bytes first. WithAggregation combines them with a
// Byzantine-robust rule instead, each replica's gradient one vote. The GPU
// and NCCL paths are untested: no machine that tests tfdist has a GPU.
package mirrored

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/internal/voting"
	"github.com/tfdist/tfdist/strategy"
)

// Strategy is MirroredStrategy: tfdist's in-graph engine (one graph holds
// every replica's copy of a step) configured with this machine's devices.
// Its methods are those of the strategy.Strategy interface, plus State for
// checkpoints, RunReplicas (a step on per-replica inputs) and the engine's
// cross-replica reads and writes (Values, Copies, Assign, Err).
type Strategy struct {
	*engine
	voter      *voting.Voter // WithAggregation's
	unregister func()        // the voter's
}

// Close releases the strategy's session and its aggregation rule.
func (s *Strategy) Close() error {
	err := s.engine.Close()
	s.unregister()
	return err
}

// engine names the embedded engine without exporting it as a field.
type engine = ingraph.Engine

// Communication chooses the CrossDeviceOps.
type Communication int

const (
	// Auto picks NCCL when every device is a GPU, else ReductionToOneDevice.
	Auto Communication = iota
	// OneDevice reduces on one device (ReductionToOneDevice).
	OneDevice
	// NCCL all-reduces with NCCL; every device must be a GPU.
	NCCL
)

type config struct {
	devices     []string
	logicalCPUs int
	comm        Communication
	cdo         strategy.CrossDeviceOps
	bytesPerPk  int64
	intra       int
	inter       int
	aggregation aggregate.Rule
	log         *zap.Logger
	shards      int // WithDeterministic's virtual shards, 0 without
}

// Option configures New.
type Option func(*config)

// WithDevices runs one replica on each named device ("/gpu:0",
// "/device:CPU:1", or full names).
func WithDevices(devices ...string) Option {
	return func(c *config) { c.devices = append([]string(nil), devices...) }
}

// WithLogicalCPUs splits the CPU into n logical devices and runs one replica
// on each.
func WithLogicalCPUs(n int) Option { return func(c *config) { c.logicalCPUs = n } }

// WithCommunication chooses how gradients are reduced (default Auto).
func WithCommunication(comm Communication) Option { return func(c *config) { c.comm = comm } }

// WithCrossDeviceOps reduces with cdo instead of the built-in choices.
func WithCrossDeviceOps(cdo strategy.CrossDeviceOps) Option { return func(c *config) { c.cdo = cdo } }

// WithBytesPerPack packs gradients smaller than n bytes into buffers of up to
// n bytes before reducing them (default 32 MiB; 0 turns packing off).
func WithBytesPerPack(n int64) Option { return func(c *config) { c.bytesPerPk = n } }

// WithThreads sets TensorFlow's intra-op and inter-op thread pool sizes;
// a size of 0 is TF_NUM_INTRAOP_THREADS or TF_NUM_INTEROP_THREADS where
// the environment sets them, else the cores the process may use (at least
// 2 inter-op threads). TensorFlow sizes its pools once per process, at its
// first session: in a process that opened one before New, they stay as it
// set them.
func WithThreads(intraOp, interOp int) Option {
	return func(c *config) { c.intra, c.inter = intraOp, interOp }
}

// WithLogger sets the logger.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// WithDeterministic makes training topology-invariant: the strategy runs
// virtualShards replicas in sync whatever its devices (each device runs
// virtualShards / devices of them in one step, each its own kernels over
// its part of the global batch, all sharing the device's copy of every
// variable), and every cross-replica sum adds the replicas' values along
// one tree on the host. Two runs with the same seed and data then end with
// the same bits on 1, 2, 4 or 8 devices, and under the one-device and
// multi-worker strategies with the same number of virtual shards.
// virtualShards must be a power of two that the devices divide;
// WithCommunication(NCCL), WithCrossDeviceOps and WithAggregation are
// errors with it. The shards' kernels are its price: a step of several
// shards of a few examples each costs their dispatch, of tens or more
// examples little (see docs/benchmarks.md). See docs/reproducibility.md.
func WithDeterministic(virtualShards int) Option {
	return func(c *config) { c.shards = virtualShards }
}

// DefaultBytesPerPack is the default packing threshold (tf.distribute's).
const DefaultBytesPerPack = 32 << 20

// New returns a MirroredStrategy. An unknown device is an error that lists
// the devices that exist; NCCL asked for on a non-GPU device is an error.
func New(opts ...Option) (*Strategy, error) {
	c := config{bytesPerPk: DefaultBytesPerPack}
	for _, o := range opts {
		o(&c)
	}
	if c.logicalCPUs < 0 {
		return nil, fmt.Errorf("mirrored: WithLogicalCPUs(%d): expected a positive count", c.logicalCPUs)
	}
	if err := c.checkDeterministic(); err != nil {
		return nil, err
	}
	var sessOpts []tfrt.ConfigOption
	if c.logicalCPUs > 0 {
		sessOpts = append(sessOpts, tfrt.WithLogicalCPUs(c.logicalCPUs))
	}
	intra, inter, err := tfrt.ResolveThreads(c.intra, c.inter)
	if err != nil {
		return nil, fmt.Errorf("mirrored: %w", err)
	}
	sessOpts = append(sessOpts, tfrt.WithThreads(intra, inter))

	available, err := tfrt.LocalDevices(sessOpts...)
	if err != nil {
		return nil, fmt.Errorf("mirrored: list devices: %w", err)
	}
	full, err := tfrt.ReplicaDevices(available, c.devices, c.logicalCPUs)
	if err != nil {
		return nil, fmt.Errorf("mirrored: %w", err)
	}
	cdo, err := chooseCrossDeviceOps(c, full)
	if err != nil {
		return nil, err
	}
	so, err := tfrt.SessionOptions("", sessOpts...)
	if err != nil {
		return nil, fmt.Errorf("mirrored: %w", err)
	}
	voter, reducer, unregister, err := newVoter(c, full)
	if err != nil {
		return nil, err
	}
	e, err := ingraph.New(ingraph.Config{
		Name:            "mirrored",
		Devices:         full,
		CrossDeviceOps:  cdo,
		GradientReducer: reducer,
		Session:         so,
		Logger:          c.log,
		VirtualShards:   c.shards,
	})
	if err != nil {
		unregister()
		return nil, fmt.Errorf("mirrored: %w", err)
	}
	return &Strategy{engine: e, voter: voter, unregister: unregister}, nil
}

func chooseCrossDeviceOps(c config, devices []string) (strategy.CrossDeviceOps, error) {
	var cdo strategy.CrossDeviceOps
	allGPU := ingraph.RequireGPUs(devices) == nil
	switch {
	case c.cdo != nil:
		cdo = c.cdo
	case c.comm == NCCL:
		if err := ingraph.RequireGPUs(devices); err != nil {
			return nil, fmt.Errorf("mirrored: WithCommunication(NCCL): %w", err)
		}
		cdo = ingraph.NCCLAllReduce{}
	case c.comm == Auto && allGPU && len(devices) > 1 && c.shards == 0:
		cdo = ingraph.NCCLAllReduce{}
	case c.comm == Auto || c.comm == OneDevice:
		// On GPUs, reduce on the first; else on the host CPU, where on a
		// CPU-only machine every replica's memory already lives.
		reduceOn := hostDevice(devices)
		if allGPU {
			reduceOn = devices[0]
		}
		cdo = ingraph.ReductionToOneDevice{Device: reduceOn, InTreeOrder: c.shards > 0}
	default:
		return nil, errors.New("mirrored: unknown Communication")
	}
	if c.bytesPerPk > 0 && (len(devices) > 1 || c.shards > 1) {
		cdo = ingraph.Packed{Inner: cdo, BytesPerPack: c.bytesPerPk}
	}
	return cdo, nil
}

// checkDeterministic refuses what cannot sum in tree order.
func (c config) checkDeterministic() error {
	switch {
	case c.shards <= 0: // the engine refuses a negative count
		return nil
	case c.cdo != nil:
		return fmt.Errorf("mirrored: WithDeterministic(%d) with WithCrossDeviceOps: the strategy's own reduction sums in tree order; use one or the other", c.shards)
	case c.comm == NCCL:
		return fmt.Errorf("mirrored: WithDeterministic(%d) with WithCommunication(NCCL): NCCL's order changes with the devices; use Auto", c.shards)
	case c.aggregation != nil:
		return fmt.Errorf("mirrored: WithDeterministic(%d) with WithAggregation(%s): a rule votes per device, which changes with their number; use one or the other", c.shards, c.aggregation)
	}
	return nil
}

// hostDevice returns the first CPU device among devices, else this
// process's CPU:0.
func hostDevice(devices []string) string {
	for _, d := range devices {
		if strings.Contains(d, "CPU:") {
			return d
		}
	}
	return strategy.LocalCPU(0)
}
