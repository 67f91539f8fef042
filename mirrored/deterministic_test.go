package mirrored_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
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
