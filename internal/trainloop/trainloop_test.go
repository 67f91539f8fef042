package trainloop

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// chunk is one Train call.
type chunk struct {
	n    int
	loss bool
}

// recorder is a Trainer that records its calls; the loss it reports is the
// number of steps run so far.
type recorder struct {
	steps  int
	chunks []chunk
	failAt int // fail the chunk that would pass this step (0: never)
}

func (r *recorder) Train(_ context.Context, n int, loss bool) (float64, error) {
	if r.failAt > 0 && r.steps+n >= r.failAt {
		return 0, errors.New("worker lost")
	}
	r.steps += n
	r.chunks = append(r.chunks, chunk{n, loss})
	if !loss {
		return 0, nil
	}
	return float64(r.steps), nil
}

// Chunks end at every multiple of LogEvery and CheckpointEvery and after
// MaxChunk steps; the loss is read at log points and after the last step;
// checkpoints follow their interval and the last step.
func TestChunksLossAndCheckpoints(t *testing.T) {
	var r recorder
	var saved, losses, after []int
	var log bytes.Buffer
	res, err := Run(context.Background(), &r, Config{
		Steps: 23, Start: 2, MaxChunk: 4, GlobalBatch: 8, LogEvery: 10, Log: &log,
		CheckpointEvery: 6,
		Checkpoint:      func(_ context.Context, step int) error { saved = append(saved, step); return nil },
		OnLoss:          func(step int, loss float64) error { losses = append(losses, step); return nil },
		AfterChunk:      func(step int) { after = append(after, step) },
	})
	require.NoError(t, err)
	assert.Equal(t, []chunk{{4, false}, {4, true}, {2, false}, {4, false}, {2, false}, {2, true}, {3, true}}, r.chunks)
	assert.Equal(t, []int{6, 10, 12, 16, 18, 20, 23}, after)
	assert.Equal(t, []int{6, 12, 18, 23}, saved)
	assert.Equal(t, []int{10, 20, 23}, losses)
	assert.Equal(t, 21.0, res.Loss, "the Trainer's loss after the last step")
	assert.Greater(t, res.ExamplesPerSec, 0.0)
	assert.Contains(t, log.String(), "step 10/23")
	assert.Contains(t, log.String(), "step 23/23")
}

// A resumed run past its last step trains nothing; a failed chunk is named
// by its steps.
func TestResumedAndFailed(t *testing.T) {
	var r recorder
	res, err := Run(context.Background(), &r, Config{Steps: 5, Start: 5, LogEvery: 1, Log: io.Discard})
	require.NoError(t, err)
	assert.Empty(t, r.chunks)
	assert.Zero(t, res.ExamplesPerSec)

	r = recorder{failAt: 7}
	_, err = Run(context.Background(), &r, Config{Steps: 20, MaxChunk: 5})
	assert.EqualError(t, err, "steps 5..9: worker lost")
	r = recorder{failAt: 3}
	_, err = Run(context.Background(), &r, Config{Steps: 20, MaxChunk: 1})
	assert.EqualError(t, err, "step 2: worker lost")
}

// Synchronous runs one step per batch and sums the last step's per-replica
// losses; an input that ends early is an error.
func TestSynchronous(t *testing.T) {
	batches := 0
	step := func(context.Context) (strategy.Result, error) {
		if batches == 3 {
			return nil, io.EOF
		}
		batches++
		a, err := tf.NewTensor(float32(batches))
		require.NoError(t, err)
		return strategy.Result{"loss": strategy.PerReplica{a, a}}, nil
	}
	reduce := func(_ context.Context, op strategy.ReduceOp, v strategy.PerReplica) (*tf.Tensor, error) {
		assert.Equal(t, strategy.Sum, op)
		var sum float32
		for _, t := range v {
			sum += t.Value().(float32)
		}
		return tf.NewTensor(sum)
	}
	tr := Synchronous(step, reduce)
	loss, err := tr.Train(context.Background(), 2, true)
	require.NoError(t, err)
	assert.Equal(t, 4.0, loss, "the second step's loss on both replicas")
	_, err = tr.Train(context.Background(), 2, false)
	assert.ErrorIs(t, err, ErrInputEnded)
}
