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
	"github.com/tfdist/tfdist/mirrored"
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

// A step that draws from a stateful random generator cannot give the same
// bits on every run and resume: under WithDeterministic its Build fails,
// naming the op and the stateless kind to use.
func TestDeterministicRefusesStatefulRandom(t *testing.T) {
	s, err := mirrored.New(mirrored.WithLogicalCPUs(2), mirrored.WithDeterministic(2))
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := rc.Scope()
		noise := op.RandomUniform(sc.SubScope("noise"), op.Shape(sc, in["x"]), tf.Float)
		return strategy.Outputs{"y": op.Add(sc, in["x"], noise)}, nil
	})
	require.Error(t, err)
	assert.Regexp(t, `op ".*noise.*" \(RandomUniform\) draws from a stateful random generator`, err.Error())
	assert.ErrorContains(t, err, "stateless random op keyed by a seed, the step and the replica")
}
