package multiworker

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/ingraph"
)

// WithZeRO shards the optimizer's state across the workers, as ZeRO's
// stages 1 and 2 (DeepSpeed; PyTorch's ZeroRedundancyOptimizer) do: each
// worker keeps the optimizer's slots (momentum, Adam's moments) for only
// its share of every variable, so that optimizer memory is divided by the
// number of workers, at the traffic of the unsharded all-reduce. A step
// packs the gradients into the all-reduce's buckets (WithBytesPerPack)
// and reduce-scatters each bucket: each worker receives the sum of its
// block of the bucket alone, updates the parameters of that block, and
// the updated blocks are all-gathered into every worker's whole copy of
// the parameters. A reduced gradient's elements have the bits the
// unsharded all-reduce gives them, so SGD, Momentum, Adam and AdamW train
// the very model they train unsharded. LARS, LAMB and ClipByGlobalNorm
// sum their squares over the shards in float64, whose float32 norm is the
// whole's, and LossScale its finite check: they too train the unsharded
// model, bit for bit wherever this was tried.
//
// A block boundary may fall inside a variable, whose slots are then
// split between two workers; a small variable's slots may lie whole on
// one worker. Checkpoints hold every slot whole under its usual name:
// saving gathers the shards (every worker saves, as always), and a
// checkpoint moves between sharded and unsharded jobs and between numbers
// of workers. Reading a slot's Value gathers it too, so every worker must
// read it.
//
// Stages 1 and 2 differ in steps that accumulate gradients
// (WithAccumulation): stage 1 keeps whole accumulators, as an unsharded
// step does, and reduce-scatters their sums once an update; stage 2
// reduce-scatters every micro-step's gradients and accumulates this
// worker's blocks alone, so that its accumulators too are divided by the
// workers, at the cost of a reduce-scatter a micro-step. A step that does
// not accumulate keeps only its blocks of the reduced gradients at both.
//
// With WithCompression(FP16 or BF16) each bucket of at least 1024
// elements is reduce-scattered in that type, summed in it too, and the
// parameters are all-gathered as float32, which they must stay: a step
// sends 0.75 of the uncompressed bytes, where a compressed all-reduce
// sends half. With WithCompression(INT8) such a bucket is reduce-scattered
// as the compressed all-reduce sends it, rounded once and summed exactly,
// so each worker's block has that all-reduce's bits and the model is the
// unsharded INT8 job's. A bucket of more than 256 Ki elements then sends
// about 0.63 of its uncompressed bytes, where a compressed all-reduce
// sends a quarter; a smaller one takes that all-reduce's direct path,
// whose levels every worker gathers whole, and sends 0.5 + 0.127·n of
// them on n workers (0.75 on 2, about as many on 4, more beyond).
//
// WithZeRO needs tfdist's engine (WithCommunication Auto or Engine) and
// two or more workers, and is refused with WithCompression(TopK),
// WithAggregation, WithLocalSGD and WithDeterministic, and in elastic jobs.
func WithZeRO(stage int) Option { return func(c *config) { c.zero = stage } }

// checkZeRO refuses a stage that does not exist and the options WithZeRO
// cannot go with.
func (c config) checkZeRO() error {
	if c.zero == 0 {
		return nil
	}
	what := fmt.Sprintf("multiworker: WithZeRO(%d)", c.zero)
	switch {
	case c.zero != 1 && c.zero != 2:
		return fmt.Errorf("%s: expected stage 1 (optimizer state sharded) or 2 (gradients too)", what)
	case c.comm != Auto && c.comm != Engine:
		return fmt.Errorf("%s with WithCommunication(%v): only tfdist's collective engine reduce-scatters; use Auto", what, c.comm)
	case c.compression.kind == topK:
		return fmt.Errorf("%s with WithCompression(%v): a reduce-scatter sends every element of a block, not the largest; use float32, fp16, bf16 or int8", what, c.compression)
	case c.aggregation != nil:
		return fmt.Errorf("%s with WithAggregation(%s): a rule needs every worker's whole gradient; use one or the other", what, c.aggregation)
	case c.localSGD != nil:
		return fmt.Errorf("%s with WithLocalSGD: local steps reduce no gradient to shard; use one or the other", what)
	case c.shards > 0:
		return fmt.Errorf("%s with WithDeterministic(%d): sharded steps do not sum in tree order; use one or the other", what, c.shards)
	case c.names != nil:
		return fmt.Errorf("%s in an elastic job: a worker that joins or leaves would take the others' shards; use multiworker.New", what)
	}
	return nil
}

// sharding returns the ingraph.Sharding of WithZeRO on ops, for worker
// rank of n; nil without WithZeRO.
func (c config) sharding(ops *engineOps, n, rank int) ingraph.Sharding {
	if c.zero == 0 {
		return nil
	}
	z := zeroOps{ops: ops, stage: c.zero, n: n, rank: rank}
	switch c.compression {
	case FP16:
		z.half = tf.Half
	case BF16:
		z.half = tf.Bfloat16
	case INT8:
		z.wire = collective.Int8
	}
	if p, ok := c.packed(ops).(ingraph.Packed); ok {
		z.packing = p
	}
	return z
}

// zeroOps is the ingraph.Sharding of WithZeRO on tfdist's engine: the
// engine's reduce-scatter and all-gathers, named in the same sequence as
// the other collectives of ops.
type zeroOps struct {
	ops     *engineOps
	packing ingraph.Packed
	stage   int
	n, rank int
	half    tf.DataType      // WithCompression's 16-bit type, which compressible buckets are reduce-scattered in; 0 without
	wire    collective.DType // collective.Int8 under WithCompression(INT8), which compressible buckets travel as; 0 without
}

var _ ingraph.Sharding = zeroOps{}

// Stage implements ingraph.Sharding.
func (z zeroOps) Stage() int { return z.stage }

// Buckets implements ingraph.Sharding.
func (z zeroOps) Buckets() ingraph.Packed { return z.packing }

// Block implements ingraph.Sharding.
func (z zeroOps) Block(elems int64) (start, n int64) {
	s, l := collective.ScatterBlock(int(elems), z.n, z.rank)
	return int64(s), int64(l)
}

// ReduceScatter implements ingraph.Sharding.
func (z zeroOps) ReduceScatter(s *op.Scope, parts []tf.Output, devices []string) (tf.Output, error) {
	if err := z.ops.check("reduce-scatter", [][]tf.Output{parts}); err != nil {
		return tf.Output{}, err
	}
	name := z.ops.name("reducescatter")
	ns := s.SubScope(name)
	hs := ns.WithDevice(z.ops.host)
	local := sumOnHost(ns.SubScope("local"), z.ops.host, parts, devices)
	in, wire := local, collective.DType(0)
	switch {
	case compressible(local) == 0:
	case z.half != 0:
		in = op.Cast(hs.SubScope("compress"), local, z.half)
	case z.wire != 0:
		wire = z.wire
	}
	block := engineops.ReduceScatter(hs.SubScope("engine"), in, z.ops.group, name, collective.Sum, wire)
	if in != local {
		block = op.Cast(hs.SubScope("widen"), block, tf.Float)
	}
	dims, ok := graphutil.StaticShape(local)
	if !ok || len(dims) != 1 {
		return tf.Output{}, fmt.Errorf("multiworker: reduce-scatter %s: a bucket of shape %v; expected a vector of known length", name, local.Shape())
	}
	_, n := z.Block(dims[0])
	return op.Reshape(hs.SubScope("block"), block, op.Const(hs.SubScope("length"), []int64{n})), ns.Err()
}

// AllGatherBlocks implements ingraph.Sharding.
func (z zeroOps) AllGatherBlocks(s *op.Scope, block tf.Output, elems int64) (tf.Output, error) {
	name := z.ops.name("allgather")
	hs := s.SubScope(name).WithDevice(z.ops.host)
	return engineops.AllGatherBlocks(hs, block, z.ops.group, name, elems), hs.Err()
}

// Gather implements ingraph.Sharding.
func (z zeroOps) Gather(s *op.Scope, x tf.Output) (tf.Output, error) {
	name := z.ops.name("allgather")
	hs := s.SubScope(name).WithDevice(z.ops.host)
	return engineops.AllGather(hs, x, z.ops.group, name), hs.Err()
}

// SumAcross implements ingraph.Sharding.
func (z zeroOps) SumAcross(s *op.Scope, x tf.Output) (tf.Output, error) {
	if err := z.ops.check("all-reduce", [][]tf.Output{{x}}); err != nil {
		return tf.Output{}, err
	}
	name := z.ops.name("allreduce")
	hs := s.SubScope(name).WithDevice(z.ops.host)
	return engineops.AllReduce(hs, x, z.ops.group, name, collective.Sum, 0), hs.Err()
}
