package classifier

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/trainloop"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// engine is what the classifier needs of a strategy: the Strategy contract
// and what checkpoints take.
type engine interface {
	strategy.Strategy
	checkpoint.Source
}

// newStrategy builds the in-graph strategy the flags ask for, and returns
// whether this process is the chief and the number of workers.
func newStrategy(ctx context.Context, o Options) (engine, bool, int, error) {
	switch o.Strategy {
	case "default":
		if o.Devices != 1 {
			return nil, false, 0, fmt.Errorf("-strategy default runs one replica; -devices %d asks for more (use -strategy mirrored)", o.Devices)
		}
		s, err := onedevice.New(onedevice.WithDeterministic(o.Deterministic))
		return s, true, 1, err
	case "mirrored":
		log, err := o.logger()
		if err != nil {
			return nil, false, 0, err
		}
		opts := []mirrored.Option{mirrored.WithLogicalCPUs(o.Devices), mirrored.WithLogger(log), mirrored.WithDeterministic(o.Deterministic)}
		if r, err := o.aggregation(); err != nil {
			return nil, false, 0, err
		} else if r != nil {
			opts = append(opts, mirrored.WithAggregation(r))
		}
		s, err := mirrored.New(opts...)
		return s, true, 1, err
	case "multiworker":
		comm := multiworker.Engine
		if o.Communication == "tensorflow" {
			comm = multiworker.Ring
		}
		log, err := o.logger()
		if err != nil {
			return nil, false, 0, err
		}
		opts, err := o.multiworkerOptions(log)
		if err != nil {
			return nil, false, 0, err
		}
		s, err := multiworker.New(ctx, append(opts, multiworker.WithCommunication(comm))...)
		if err != nil {
			return nil, false, 0, err
		}
		return s, s.IsChief(), s.NumWorkers(), nil
	}
	return nil, false, 0, fmt.Errorf("-strategy %q: expected default, mirrored, multiworker, ps or elastic", o.Strategy)
}

// multiworkerOptions are the multiworker strategy's options the flags ask
// for, but the communication.
func (o Options) multiworkerOptions(log *zap.Logger) ([]multiworker.Option, error) {
	robust, err := o.gradientOptions()
	if err != nil {
		return nil, err
	}
	return append(robust, multiworker.WithLogicalCPUs(o.Devices), multiworker.WithCollectiveTimeout(o.CollectiveTimeout),
		multiworker.WithLogger(log), multiworker.WithDeterministic(o.Deterministic)), nil
}

// inGraph is a session of a synchronous strategy (default, mirrored,
// multiworker): every step runs one global batch on all replicas, in the
// order the seed gives, so a resumed run equals an uninterrupted one.
type inGraph struct {
	o           Options
	s           engine
	m           *nn.Sequential
	acc         *metrics.Accuracy // the eval step's
	train, eval strategy.Step
	data        dataset.Dataset // the training batches, shuffled and repeated
	backup      *checkpoint.BackupAndRestore
	input       *dataset.DistIterator
	afterStep   func(context.Context) error // after each step that ran, if set
}

// newInGraphSession builds the strategy, the model and its steps, and
// fills in res's replicas, workers and chief.
func newInGraphSession(ctx context.Context, o Options, train digits.Data, res *Result) (*inGraph, error) {
	s, chief, workers, err := newStrategy(ctx, o)
	if err != nil {
		return nil, err
	}
	g := &inGraph{o: o, s: s}
	res.Replicas, res.Workers, res.Chief = s.NumReplicasInSync(), workers, chief
	if err := g.build(train, chief); err != nil {
		s.Close()
		return nil, err
	}
	return g, nil
}

func (g *inGraph) build(train digits.Data, chief bool) error {
	if g.o.GlobalBatch%g.s.NumReplicasInSync() != 0 {
		return fmt.Errorf("-global-batch %d does not divide by the %d replicas in sync", g.o.GlobalBatch, g.s.NumReplicasInSync())
	}
	ds, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
	if err != nil {
		return err
	}
	g.data = dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, train.Len(), g.o.Seed), -1), g.o.GlobalBatch, true)
	if g.o.DP.on() {
		if g.o.dp, err = newPrivacy(g.o, train.Len(), g.s.NumReplicasInSync()); err != nil {
			return err
		}
		if g.data, err = g.o.dp.batches(train, g.o.Steps, g.o.Seed); err != nil {
			return err
		}
	}
	b, err := buildModel(g.o, g.s.Scope, g.s.Build, true)
	if err != nil {
		return err
	}
	g.m, g.acc, g.train, g.eval = b.m, b.acc, b.train, b.eval
	if g.o.CheckpointDir != "" {
		g.backup, err = checkpoint.NewBackupAndRestore(g.s, g.o.CheckpointDir, int64(g.o.CheckpointEvery), checkpoint.WithChief(chief))
	}
	return err
}

func (g *inGraph) model() *nn.Sequential { return g.m }

func (g *inGraph) restore(ctx context.Context) (int, error) {
	if g.backup == nil {
		return 0, nil
	}
	done, err := g.backup.Restore(ctx)
	return int(done), err
}

// trainer starts the input after start steps: the checkpoint's step is
// also the input position, since the input order is a function of the
// seed.
func (g *inGraph) trainer(ctx context.Context, start int, times *stepTimes) (trainloop.Trainer, int, error) {
	dist, err := g.s.DistributeDataset(dataset.Take(dataset.Skip(g.data, start), g.o.Steps-start),
		dataset.WithShardPolicy(dataset.ShardBatch), dataset.WithPrefetch(2))
	if err != nil {
		return nil, 0, err
	}
	if g.input, err = dist.Iterator(ctx); err != nil {
		return nil, 0, err
	}
	step := func(ctx context.Context) (strategy.Result, error) {
		begin := time.Now()
		b, err := g.input.Next(ctx)
		if err != nil {
			return nil, err
		}
		if g.o.StepTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, g.o.StepTimeout)
			defer cancel()
		}
		out, err := g.s.Run(ctx, g.train, b)
		if err == nil {
			times.add(0, time.Since(begin))
		}
		if err == nil && g.afterStep != nil {
			err = g.afterStep(ctx)
		}
		return out, err
	}
	return trainloop.Synchronous(step, g.s.Reduce), 1, nil
}

func (g *inGraph) checkpoint(ctx context.Context, step int) error {
	return g.backup.AfterStep(ctx, int64(step))
}

// finish adds the breakdown of the worker's timeline, when it kept one.
func (g *inGraph) finish(_ context.Context, res *Result, _ io.Writer) error {
	if o, ok := g.s.(interface{ Timeline() *timeline.Recorder }); ok && o.Timeline() != nil {
		spans, _ := o.Timeline().Spans()
		b := timeline.Summarize(spans)
		res.Breakdown = &b
	}
	return nil
}

func (g *inGraph) evaluate(ctx context.Context, test digits.Data) (float64, error) {
	return models.Accuracy(ctx, g.s, g.eval, g.acc, test, g.o.GlobalBatch)
}

func (g *inGraph) strategy() strategy.ValueReader { return g.s }

func (g *inGraph) privacy() *privacy { return g.o.dp }

func (g *inGraph) close() error {
	g.closeInput()
	return g.s.Close()
}

// closeInput stops the input pipeline, if it started.
func (g *inGraph) closeInput() {
	if g.input != nil {
		g.input.Close()
	}
}
