package mirrored_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// With WithDeterministic(4), Mirrored on 1, 2 and 4 devices trains the
// one-device strategy's model with 4 virtual shards bit for bit: every
// element of every variable, Adam's slots included, is equal, and so is
// the loss. Every device's copies of every variable stay identical.
func TestDeterministicMatchesOneDevice(t *testing.T) {
	const steps, gb = 30, 32
	adam := func() *optimizer.Adam { return optimizer.NewAdam(optimizer.Constant(0.01)) }
	def, err := onedevice.New(onedevice.WithDeterministic(4))
	require.NoError(t, err)
	defer def.Close()
	require.Equal(t, 4, def.NumReplicasInSync(), "virtual shards are the replicas in sync")
	want, err := testmodel.Train(ctx, def, adam(), steps, gb, 0)
	require.NoError(t, err)
	// The shards of a device share its copy of each variable, updated once
	// a step: the model is one device's, up to float summation order.
	plain, err := onedevice.New()
	require.NoError(t, err)
	defer plain.Close()
	ref, err := testmodel.Train(ctx, plain, adam(), steps, gb, 0)
	require.NoError(t, err)
	d, at := testmodel.MaxVarDiff(ref, want)
	assert.Less(t, d, 1e-4, "4 shards on one device against one device: largest difference at %s", at)
	for _, n := range []int{1, 2, 4} {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(n), mirrored.WithDeterministic(4))
		require.NoError(t, err)
		got, err := testmodel.Train(ctx, s, adam(), steps, gb, 0)
		require.NoError(t, err)
		assert.Equal(t, want.FinalLoss, got.FinalLoss, "%d devices: the loss", n)
		d, at := testmodel.MaxVarDiff(want, got)
		assert.Zero(t, d, "%d devices: largest difference at %s", n, at)
		differ, err := testmodel.DifferingCopies(ctx, s)
		require.NoError(t, err)
		assert.Empty(t, differ, "%d devices: every copy of every variable is identical", n)
		require.NoError(t, s.Close())
	}
}

// WithDeterministic refuses, naming the value and what would work, a
// number of virtual shards that is not a power of two or that the devices
// do not divide, and the options whose sums cannot follow its tree.
func TestDeterministicRefuses(t *testing.T) {
	for _, c := range []struct {
		opts []mirrored.Option
		want string
	}{
		{[]mirrored.Option{mirrored.WithDeterministic(6)}, "deterministic with 6 virtual shards: expected a power of two"},
		{[]mirrored.Option{mirrored.WithDeterministic(-2)}, "deterministic with -2 virtual shards: expected a power of two"},
		{[]mirrored.Option{mirrored.WithLogicalCPUs(3), mirrored.WithDeterministic(8)},
			"deterministic with 8 virtual shards: 3 replicas in sync do not divide them; expected a replica count that divides 8"},
		{[]mirrored.Option{mirrored.WithLogicalCPUs(4), mirrored.WithDeterministic(2)}, "4 replicas in sync do not divide them"},
		{[]mirrored.Option{mirrored.WithDeterministic(4), mirrored.WithCommunication(mirrored.NCCL)}, "WithDeterministic(4) with WithCommunication(NCCL)"},
		{[]mirrored.Option{mirrored.WithDeterministic(4), mirrored.WithAggregation(aggregate.Median())}, "WithDeterministic(4) with WithAggregation(median)"},
		{[]mirrored.Option{mirrored.WithDeterministic(4), mirrored.WithCrossDeviceOps(ingraph.ReductionToOneDevice{})}, "WithDeterministic(4) with WithCrossDeviceOps"},
	} {
		_, err := mirrored.New(c.opts...)
		assert.ErrorContains(t, err, c.want)
	}
	_, err := onedevice.New(onedevice.WithDeterministic(3))
	assert.ErrorContains(t, err, "deterministic with 3 virtual shards: expected a power of two")
}

// A BatchNorm model trained with virtual shards, saved, and resumed from
// its checkpoint by a new strategy on another number of devices ends bit
// for bit as the run never interrupted: a checkpoint holds every shard's
// moving statistics, which each shard moves with its own batches, besides
// their mean. Without them every shard would restart from the mean.
func TestDeterministicBatchNormResumes(t *testing.T) {
	const steps, at, gb = 12, 5, 64
	adam := func() *optimizer.Adam { return optimizer.NewAdam(optimizer.Constant(0.01)) }
	prefix := filepath.Join(t.TempDir(), "ckpt")
	train := func(devices, start int, then func(s *mirrored.Strategy) error) testmodel.Outcome {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(devices), mirrored.WithDeterministic(4))
		require.NoError(t, err)
		defer s.Close()
		out, err := testmodel.TrainPlan(ctx, s, adam(), testmodel.Plan{Model: "lenet-bn", Steps: steps, Start: start,
			MicroBatches: []int{gb}, AfterRuns: func(done int) error {
				if done == at {
					return then(s)
				}
				return nil
			}})
		require.NoError(t, err)
		return out
	}
	want := train(2, 0, func(s *mirrored.Strategy) error {
		sv, err := checkpoint.NewSaver(s)
		if err != nil {
			return err
		}
		return sv.Save(ctx, prefix, nil)
	})
	got := train(4, at, func(s *mirrored.Strategy) error {
		sv, err := checkpoint.NewSaver(s)
		if err != nil {
			return err
		}
		_, err = sv.Restore(ctx, prefix)
		return err
	})
	d, where := testmodel.MaxVarDiff(want, got)
	assert.Zero(t, d, "resumed on 4 devices against uninterrupted on 2: largest difference at %s", where)
	entries, err := checkpoint.List(prefix)
	require.NoError(t, err)
	var copies []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name, checkpoint.CopiesPrefix) {
			copies = append(copies, e.String())
		}
	}
	assert.NotEmpty(t, copies, "the checkpoint holds the shards' copies of the moving statistics")
	for _, c := range copies {
		assert.Contains(t, c, "[4 ", "one row per shard: %s", c)
	}
	// Strategies of other replica counts restore the statistics' mean.
	type engine interface {
		testmodel.Engine
		checkpoint.Source
		Close() error
	}
	for name, s := range map[string]func() (engine, error){
		"one device": func() (engine, error) { return onedevice.New() },
		"2 shards": func() (engine, error) {
			return mirrored.New(mirrored.WithLogicalCPUs(2), mirrored.WithDeterministic(2))
		},
		"plain 2 CPUs": func() (engine, error) { return mirrored.New(mirrored.WithLogicalCPUs(2)) },
	} {
		e, err := s()
		require.NoError(t, err)
		_, err = testmodel.TrainPlan(ctx, e, adam(), testmodel.Plan{Model: "lenet-bn", Steps: at + 1, Start: at,
			MicroBatches: []int{gb}, AfterRuns: func(done int) error {
				if done != at {
					return nil
				}
				sv, err := checkpoint.NewSaver(e)
				if err != nil {
					return err
				}
				_, err = sv.Restore(ctx, prefix)
				return err
			}})
		assert.NoError(t, err, name)
		require.NoError(t, e.Close())
	}
}

// A step with an op that cannot give the same bits on every run and
// resume fails to build under WithDeterministic, naming the op and what
// would work: a stateful random op, the clock, and an op whose GPU kernel
// TensorFlow's op determinism refuses (placed on a GPU, which the check
// reads from the graph; on a CPU the same op builds).
func TestDeterministicRefusesIrreproducibleOps(t *testing.T) {
	gpu := func(sc *op.Scope) *op.Scope { return sc.WithDevice("/device:GPU:0") }
	for _, c := range []struct {
		name, want string
		step       func(sc *op.Scope, x tf.Output) tf.Output
	}{
		{"stateful random", `op ".*noise.*" \(RandomUniform\) draws from a stateful random generator.*stateless random op keyed by a seed, the step and the replica`,
			func(sc *op.Scope, x tf.Output) tf.Output {
				return op.Add(sc.SubScope("add"), x, op.RandomUniform(sc.SubScope("noise"), op.Shape(sc.SubScope("shape"), x), tf.Float))
			}},
		{"clock", `op ".*clock.*" \(Timestamp\) returns the clock's time.*feed the time as an input`,
			func(sc *op.Scope, x tf.Output) tf.Output {
				return op.Add(sc.SubScope("add"), x, op.Cast(sc.SubScope("cast"), op.Timestamp(sc.SubScope("clock")), tf.Float))
			}},
		{"fused cross-entropy on a GPU", `op ".*xent.*" \(SoftmaxCrossEntropyWithLogits\) has no deterministic GPU kernel.*place it on a CPU, whose kernel is deterministic, or compute the loss with nn.SoftmaxCrossEntropy`,
			func(sc *op.Scope, x tf.Output) tf.Output {
				b := nn.NewBuilder(sc, "t")
				logits := b.Reshape(x, -1, 1)
				loss, _ := op.SoftmaxCrossEntropyWithLogits(gpu(sc.SubScope("xent")), logits, op.OnesLike(b.Op(), logits))
				return loss
			}},
		{"batch norm's gradient, not training, on a GPU", `op ".*bn_grad.*" \(FusedBatchNormGradV3\) has no deterministic GPU kernel`,
			func(sc *op.Scope, x tf.Output) tf.Output {
				b := nn.NewBuilder(sc, "t")
				img, one := b.Reshape(x, -1, 1, 1, 1), b.Const([]float32{1})
				dx, _, _, _, _ := op.FusedBatchNormGradV3(gpu(sc.SubScope("bn_grad")), img, img, one, one, one, one, op.FusedBatchNormGradV3IsTraining(false))
				return b.Reshape(dx, -1)
			}},
	} {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(2), mirrored.WithDeterministic(2))
		require.NoError(t, err)
		_, err = s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"y": c.step(rc.Scope(), in["x"])}, nil
		})
		if assert.Error(t, err, c.name) {
			assert.Regexp(t, c.want, err.Error(), c.name)
		}
		require.NoError(t, s.Close())
	}
	// On a CPU, the fused cross-entropy has a deterministic kernel.
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2), mirrored.WithDeterministic(2))
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 3}}}, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope()
		loss, _ := op.SoftmaxCrossEntropyWithLogits(sc.SubScope("xent"), in["x"], op.OnesLike(sc.SubScope("labels"), in["x"]))
		return strategy.Outputs{"y": loss}, nil
	})
	assert.NoError(t, err)
}

// Under op determinism, nn.SoftmaxCrossEntropy on a device that is not a
// CPU builds no fused cross-entropy, whose GPU kernel would fail, and its
// log-softmax form gives the fused kernel's loss and gradient (run here on
// a CPU, by soft placement).
func TestDeterministicCrossEntropyOffTheCPU(t *testing.T) {
	require.NoError(t, tfrt.EnableOpDeterminism())
	s := op.NewScope()
	logits := op.Const(s.SubScope("logits"), [][]float32{{2, -1, 0.5, 3}, {-4, 0, 1, 1}, {0, 0, 0, 0}})
	labels := op.Const(s.SubScope("labels"), [][]float32{{0, 0, 0, 1}, {0.5, 0.5, 0, 0}, {0.25, 0.25, 0.25, 0.25}})
	cpu := nn.SoftmaxCrossEntropy(s.SubScope("cpu").WithDevice("/device:CPU:0"), logits, labels)
	gpu := nn.SoftmaxCrossEntropy(s.SubScope("gpu").WithDevice("/device:GPU:0"), logits, labels)
	g, err := s.Finalize()
	require.NoError(t, err)
	for _, o := range g.Operations() {
		assert.False(t, strings.HasPrefix(o.Name(), "gpu/") && o.Type() == "SoftmaxCrossEntropyWithLogits", o.Name())
	}
	grads, err := g.AddGradients("grads", []tf.Output{cpu}, []tf.Output{logits}, nil)
	require.NoError(t, err)
	gradsGPU, err := g.AddGradients("grads_gpu", []tf.Output{gpu}, []tf.Output{logits}, nil)
	require.NoError(t, err)
	opts, err := tfrt.SessionOptions("", tfrt.WithSoftPlacement(true))
	require.NoError(t, err)
	sess, err := tf.NewSession(g, opts)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, []tf.Output{cpu, gpu, grads[0], gradsGPU[0]}, nil)
	require.NoError(t, err)
	assert.InDeltaSlice(t, out[0].Value().([]float32), out[1].Value().([]float32), 1e-6, "loss")
	want, got := out[2].Value().([][]float32), out[3].Value().([][]float32)
	for i := range want {
		assert.InDeltaSlice(t, want[i], got[i], 1e-6, "gradient, row %d", i)
	}
}
