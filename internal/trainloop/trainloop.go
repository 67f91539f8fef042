// Package trainloop is the training loop of tfdist's digits programs and of
// the strategies' equivalence tests, written once: it runs steps in chunks,
// reads the loss when it is due, reports progress, checkpoints, and
// measures the rate. How a strategy runs steps plugs in as a Trainer: a
// synchronous strategy runs one batch after another (Synchronous), the
// parameter-server strategy schedules a chunk of steps through its
// coordinator and joins them.
package trainloop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/progress"
	"github.com/tfdist/tfdist/strategy"
)

// Trainer runs training steps the way one strategy does.
type Trainer interface {
	// Train runs the next n steps. When loss is true it also returns a
	// loss that stands for them (Synchronous: the last step's; the
	// parameter-server classifier: their mean); otherwise 0.
	Train(ctx context.Context, n int, loss bool) (float64, error)
}

// TrainerFunc adapts a function to Trainer.
type TrainerFunc func(ctx context.Context, n int, loss bool) (float64, error)

// Train implements Trainer.
func (f TrainerFunc) Train(ctx context.Context, n int, loss bool) (float64, error) {
	return f(ctx, n, loss)
}

// ErrInputEnded is returned by a Synchronous Trainer whose input ends
// before the steps it was asked for.
var ErrInputEnded = errors.New("trainloop: the input ended")

// Synchronous returns the Trainer of a synchronous strategy: step runs one
// step on the next batch and returns its outputs (io.EOF when the input
// has ended); the loss is the last step's output "loss" summed over the
// replicas by reduce (each replica outputs its share of the average).
func Synchronous(step func(context.Context) (strategy.Result, error),
	reduce func(context.Context, strategy.ReduceOp, strategy.PerReplica) (*tf.Tensor, error)) Trainer {
	return TrainerFunc(func(ctx context.Context, n int, loss bool) (float64, error) {
		var out strategy.Result
		for range n {
			var err error
			if out, err = step(ctx); errors.Is(err, io.EOF) {
				return 0, ErrInputEnded
			} else if err != nil {
				return 0, err
			}
		}
		if !loss || n == 0 {
			return 0, nil
		}
		return scalar(ctx, reduce, out["loss"])
	})
}

// scalar returns the sum over replicas of a float32 scalar output.
func scalar(ctx context.Context, reduce func(context.Context, strategy.ReduceOp, strategy.PerReplica) (*tf.Tensor, error),
	v strategy.PerReplica) (float64, error) {
	t, err := reduce(ctx, strategy.Sum, v)
	if err != nil {
		return 0, err
	}
	f, ok := tensorutil.Value(t).(float32)
	if !ok {
		return 0, fmt.Errorf("trainloop: output of type %T, expected a float32 scalar", tensorutil.Value(t))
	}
	return float64(f), nil
}

// Config says how Run trains.
type Config struct {
	// Steps is the step the run ends after; Start is the number of steps
	// done before it (restored from a checkpoint).
	Steps, Start int
	// MaxChunk bounds the steps of one Train call (0: no bound). A chunk
	// also ends at every multiple of LogEvery and, with Checkpoint, of
	// CheckpointEvery.
	MaxChunk int
	// GlobalBatch is the number of examples of one step, for the rate.
	GlobalBatch int
	// LogEvery is how often, in steps, the loss is read (0: only after the
	// last step, when it always is).
	LogEvery int
	// Log, with LogEvery > 0, receives a progress line every LogEvery
	// steps and a last one (a progress.Reporter's).
	Log io.Writer
	// Checkpoint, when set, runs after every multiple of CheckpointEvery
	// and after the last step; what it saves is its own affair.
	Checkpoint func(ctx context.Context, step int) error
	// CheckpointEvery is the interval of Checkpoint, in steps.
	CheckpointEvery int
	// OnLoss, when set, receives every loss read.
	OnLoss func(step int, loss float64) error
	// AfterChunk, when set, runs after every chunk, once its checkpoint
	// and progress line are done.
	AfterChunk func(step int)
	// Progress adds options to the progress lines (progress.WithMetric,
	// say).
	Progress []progress.Option
}

// Result is how a run ended.
type Result struct {
	// Loss is the loss read after the last step; 0 when the run trained no
	// step.
	Loss float64
	// ExamplesPerSec is the rate over the steps this run trained.
	ExamplesPerSec float64
}

// Run trains with t from step c.Start to c.Steps.
func Run(ctx context.Context, t Trainer, c Config) (Result, error) {
	var res Result
	var report *progress.Reporter
	if c.Log != nil && c.LogEvery > 0 {
		opts := append([]progress.Option{progress.WithEvery(c.LogEvery), progress.WithInitialStep(c.Start)}, c.Progress...)
		report = progress.New(c.Log, c.Steps, c.GlobalBatch, opts...)
	}
	start := time.Now()
	for step := c.Start; step < c.Steps; {
		end := c.chunkEnd(step)
		lossDue := end == c.Steps || every(end, c.LogEvery)
		loss, err := t.Train(ctx, end-step, lossDue)
		if err != nil {
			return res, stepsError(step, end, err)
		}
		step = end
		if lossDue {
			res.Loss = loss
		}
		if err := c.afterChunk(ctx, step, lossDue, loss); err != nil {
			return res, err
		}
		if report != nil {
			report.Update(step, res.Loss)
		}
		if c.AfterChunk != nil {
			c.AfterChunk(step)
		}
	}
	if report != nil {
		if err := report.Close(); err != nil {
			return res, err
		}
	}
	if el := time.Since(start).Seconds(); el > 0 && c.Steps > c.Start {
		res.ExamplesPerSec = float64((c.Steps-c.Start)*c.GlobalBatch) / el
	}
	return res, nil
}

// chunkEnd returns the step the chunk that starts after step ends after.
func (c Config) chunkEnd(step int) int {
	end := c.Steps
	if c.MaxChunk > 0 {
		end = min(end, step+c.MaxChunk)
	}
	bounds := []int{c.LogEvery}
	if c.Checkpoint != nil {
		bounds = append(bounds, c.CheckpointEvery)
	}
	for _, n := range bounds {
		if n > 0 {
			end = min(end, (step/n+1)*n)
		}
	}
	return end
}

// afterChunk hands the loss to OnLoss and checkpoints, as due.
func (c Config) afterChunk(ctx context.Context, step int, lossDue bool, loss float64) error {
	if lossDue && c.OnLoss != nil {
		if err := c.OnLoss(step, loss); err != nil {
			return err
		}
	}
	if c.Checkpoint != nil && (step == c.Steps || every(step, c.CheckpointEvery)) {
		return c.Checkpoint(ctx, step)
	}
	return nil
}

// every reports whether step is a multiple of n > 0.
func every(step, n int) bool { return n > 0 && step%n == 0 }

// stepsError names the steps after from, up to to, that err ended.
func stepsError(from, to int, err error) error {
	if to-from == 1 {
		return fmt.Errorf("step %d: %w", from, err)
	}
	return fmt.Errorf("steps %d..%d: %w", from, to-1, err)
}
