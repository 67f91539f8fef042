package main

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/strategy"
)

// The loop trains, and a second run resumes after the saved epoch: the
// resumed epoch equals the one an uninterrupted run trains.
func TestTrainsAndResumes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, err := onDevices(ctx, options{dir: dir, epochs: 2, devices: 2, globalBatch: 64, seed: 3, decayEpochs: 10}, io.Discard)
	require.NoError(t, err)
	require.Len(t, first.Epochs, 2)
	assert.Less(t, first.Epochs[1].Loss, first.Epochs[0].Loss*1.5)

	var log bytes.Buffer
	resumed, err := onDevices(ctx, options{dir: dir, epochs: 3, devices: 2, globalBatch: 64, seed: 3, decayEpochs: 10}, &log)
	require.NoError(t, err)
	assert.Equal(t, 2, resumed.ResumedAfter)
	require.Len(t, resumed.Epochs, 1)
	assert.Equal(t, 3, resumed.Epochs[0].Epoch)
	assert.Contains(t, log.String(), "resumed after epoch 2")

	whole, err := onDevices(ctx, options{dir: t.TempDir(), epochs: 3, devices: 2, globalBatch: 64, seed: 3, decayEpochs: 10}, io.Discard)
	require.NoError(t, err)
	require.Len(t, whole.Epochs, 3)
	assert.InDelta(t, whole.Epochs[2].Loss, resumed.Epochs[0].Loss, 1e-4*whole.Epochs[2].Loss, "resumed epoch 3 equals the uninterrupted one")
	assert.InDelta(t, whole.Epochs[2].Accuracy, resumed.Epochs[0].Accuracy, 1e-6)
	assert.GreaterOrEqual(t, whole.HeldOut, 0.90)
	assert.InDelta(t, whole.HeldOut, resumed.HeldOut, 1e-6)
	assert.Greater(t, whole.Epochs[2].Accuracy, 0.85, "the OnRead metric sums every replica's counts")
}

// Two replicas, each fed per-replica batches by its own pipeline, end with
// the model one replica trains on the same global batches, every element
// of every variable within 1e-4, and count the same training accuracy.
func TestTwoReplicasMatchOne(t *testing.T) {
	ctx := context.Background()
	train := func(devices int) ([]strategy.VariableValue, report) {
		s, err := mirrored.New(mirrored.WithLogicalCPUs(devices))
		require.NoError(t, err)
		defer s.Close()
		rep, err := run(ctx, s, options{dir: t.TempDir(), epochs: 2, devices: devices, globalBatch: 64, seed: 5, decayEpochs: 10}, io.Discard)
		require.NoError(t, err)
		vals, err := strategy.ReadVariables(ctx, s, rep.model.Variables())
		require.NoError(t, err)
		return vals, rep
	}
	want, wantRep := train(1)
	require.Len(t, want, 4, "two dense layers, each a kernel and a bias")
	got, rep := train(2)
	diff, name, i := strategy.MaxDiff(want, got)
	assert.Less(t, diff, 1e-4, "%s[%d]", name, i)
	for e := range wantRep.Epochs {
		assert.InDelta(t, wantRep.Epochs[e].Loss, rep.Epochs[e].Loss, 1e-4, "epoch %d", e+1)
		assert.InDelta(t, wantRep.Epochs[e].Accuracy, rep.Epochs[e].Accuracy, 1e-6, "epoch %d", e+1)
	}
	assert.InDelta(t, wantRep.HeldOut, rep.HeldOut, 1e-9)
}
