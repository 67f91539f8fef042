// Package classifier is the digits classifier behind examples/classifier,
// `make demo` and `tfdist demo`: an MLP trained on the UCI handwritten digits
// under any strategy — default, mirrored, multiworker or ps — with the same
// flags everywhere. With the same seed, data order and global batch, every
// synchronous strategy ends with the default strategy's model, up to float
// summation order: compare FinalLoss and ParamL2.
package classifier

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/progress"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/summary"
)

// Options are the classifier's flags.
type Options struct {
	Strategy    string
	Model       string
	Devices     int
	GlobalBatch int
	Steps       int
	LR          float64
	Optimizer   string
	Seed        uint64
	Hidden      int
	TestSize    int
	LogEvery    int
	JSON        bool

	LogDir            string
	CheckpointDir     string
	CheckpointEvery   int
	CollectiveTimeout time.Duration
	Communication     string
	StatsEvery        time.Duration
}

// Result is what a run reports (the -json line of the command).
type Result struct {
	Strategy       string  `json:"strategy"`
	Replicas       int     `json:"replicas"`
	Workers        int     `json:"workers"`
	GlobalBatch    int     `json:"global_batch"`
	Steps          int     `json:"steps"`
	FinalLoss      float64 `json:"final_loss"`
	Accuracy       float64 `json:"accuracy"`
	ParamL2        float64 `json:"param_l2"`
	ExamplesPerSec float64 `json:"examples_per_sec"`
	Chief          bool    `json:"chief"`
	// AppliedSteps is, under -strategy ps, how many updates the ps tasks applied.
	AppliedSteps int64 `json:"applied_steps,omitempty"`
}

// RegisterFlags defines the classifier's flags on fs, storing into o.
func RegisterFlags(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.Strategy, "strategy", "default", "distribution strategy: default, mirrored, multiworker or ps")
	if o.Model == "" {
		o.Model = "mlp"
	}
	fs.StringVar(&o.Model, "model", o.Model, fmt.Sprintf("model: one of %v", models.Names))
	fs.IntVar(&o.Devices, "devices", 1, "replicas per process (logical CPU devices)")
	fs.IntVar(&o.GlobalBatch, "global-batch", 64, "examples per step across all replicas")
	fs.IntVar(&o.Steps, "steps", 300, "training steps")
	fs.Float64Var(&o.LR, "lr", 0.1, "learning rate")
	fs.StringVar(&o.Optimizer, "optimizer", "sgd", "optimizer: sgd, momentum or adam")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the initial weights, the data split and the shuffle")
	fs.IntVar(&o.Hidden, "hidden", 64, "hidden units")
	fs.IntVar(&o.TestSize, "test-size", 297, "held-out examples")
	fs.IntVar(&o.LogEvery, "log-every", 50, "print progress every N steps (0: never)")
	fs.BoolVar(&o.JSON, "json", false, "end with one JSON line of results on stdout")
	fs.StringVar(&o.LogDir, "logdir", "", "write TensorBoard event files (loss, accuracy, examples/s) into this directory; the chief only")
	fs.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "checkpoint here every -checkpoint-every steps and resume from the latest checkpoint on start")
	fs.IntVar(&o.CheckpointEvery, "checkpoint-every", 50, "steps between checkpoints")
	fs.DurationVar(&o.CollectiveTimeout, "collective-timeout", 60*time.Second, "multiworker: how long a step waits for its peers before failing and naming a dead or silent one (0: forever)")
	fs.StringVar(&o.Communication, "communication", "tfdist", "multiworker: who moves tensors between workers: tfdist (its own collective engine) or tensorflow (TensorFlow's ring collectives)")
	fs.DurationVar(&o.StatsEvery, "stats-every", 0, "print a line 'stats goroutines=N heap=BYTES' every `D` (0: never), for soak runs that watch the process")
}

// Check reports the first flag whose value cannot work.
func (o Options) Check() error {
	switch {
	case !slices.Contains(models.Names, o.Model):
		return fmt.Errorf("-model %q: expected one of %v", o.Model, models.Names)
	case o.Devices < 1:
		return fmt.Errorf("-devices %d: expected at least 1", o.Devices)
	case o.GlobalBatch < 1:
		return fmt.Errorf("-global-batch %d: expected at least 1", o.GlobalBatch)
	case o.Steps < 0:
		return fmt.Errorf("-steps %d: expected 0 or more", o.Steps)
	case o.TestSize < 1 || o.TestSize >= digits.Examples:
		return fmt.Errorf("-test-size %d: expected 1..%d", o.TestSize, digits.Examples-1)
	case o.CheckpointEvery < 1:
		return fmt.Errorf("-checkpoint-every %d: expected at least 1", o.CheckpointEvery)
	case o.CollectiveTimeout < 0:
		return fmt.Errorf("-collective-timeout %v: expected a positive duration, or 0 to wait forever", o.CollectiveTimeout)
	case o.Communication != "tfdist" && o.Communication != "tensorflow":
		return fmt.Errorf("-communication %q: expected tfdist or tensorflow", o.Communication)
	case o.StatsEvery < 0:
		return fmt.Errorf("-stats-every %v: expected a positive duration, or 0 for none", o.StatsEvery)
	}
	return nil
}

// ParseFlags parses the classifier's command-line flags and checks them.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	return parseFlags("classifier", "mlp", args, stderr)
}

func parseFlags(prog, model string, args []string, stderr io.Writer) (Options, error) {
	o := Options{Model: model}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	RegisterFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Check()
}

// engine is what the classifier needs of a strategy: the Strategy contract
// and what checkpoints take.
type engine interface {
	strategy.Strategy
	checkpoint.Engine
}

// newStrategy builds the strategy the flags ask for.
func newStrategy(ctx context.Context, o Options) (engine, func() bool, int, error) {
	chief := func() bool { return true }
	switch o.Strategy {
	case "default":
		if o.Devices != 1 {
			return nil, nil, 0, fmt.Errorf("-strategy default runs one replica; -devices %d asks for more (use -strategy mirrored)", o.Devices)
		}
		s, err := strategy.Default()
		return s, chief, 1, err
	case "mirrored":
		s, err := mirrored.New(mirrored.WithLogicalCPUs(o.Devices))
		return s, chief, 1, err
	case "multiworker":
		comm := multiworker.Engine
		if o.Communication == "tensorflow" {
			comm = multiworker.Ring
		}
		s, err := multiworker.New(ctx, multiworker.WithLogicalCPUs(o.Devices), multiworker.WithCollectiveTimeout(o.CollectiveTimeout),
			multiworker.WithCommunication(comm))
		if err != nil {
			return nil, nil, 0, err
		}
		return s, s.IsChief, s.NumWorkers(), nil
	}
	return nil, nil, 0, fmt.Errorf("-strategy %q: expected default, mirrored, multiworker or ps", o.Strategy)
}

func newOptimizer(o Options) (strategy.Optimizer, error) {
	switch o.Optimizer {
	case "sgd":
		return optimizer.NewSGD(optimizer.Constant(o.LR)), nil
	case "momentum":
		return optimizer.NewMomentum(optimizer.Constant(o.LR), 0.9, false), nil
	case "adam":
		return optimizer.NewAdam(optimizer.Constant(o.LR)), nil
	}
	return nil, fmt.Errorf("-optimizer %q: expected sgd, momentum or adam", o.Optimizer)
}

// Run trains and evaluates; progress goes to log, results to the caller.
// On a ps or worker task of a parameter-server cluster it serves until the
// chief is done and returns paramserver.ErrNotChief.
func Run(ctx context.Context, o Options, log io.Writer) (Result, error) {
	if o.StatsEvery > 0 {
		defer reportStats(log, o.StatsEvery)()
	}
	if o.Strategy == "ps" {
		return runPS(ctx, o, log) // scheduled steps, not a strategy.Strategy: see ps.go
	}
	res := Result{Strategy: o.Strategy, GlobalBatch: o.GlobalBatch, Steps: o.Steps}
	opt, err := newOptimizer(o)
	if err != nil {
		return res, err
	}
	s, isChief, workers, err := newStrategy(ctx, o)
	if err != nil {
		return res, err
	}
	defer s.Close()
	res.Replicas, res.Workers, res.Chief = s.NumReplicasInSync(), workers, isChief()
	if o.GlobalBatch%s.NumReplicasInSync() != 0 {
		return res, fmt.Errorf("-global-batch %d does not divide by the %d replicas in sync", o.GlobalBatch, s.NumReplicasInSync())
	}

	data, err := digits.Load()
	if err != nil {
		return res, err
	}
	train, test := data.Split(o.TestSize, o.Seed)
	trainDS, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
	if err != nil {
		return res, err
	}
	trainDS = dataset.Batched(dataset.Repeat(dataset.Shuffle(trainDS, train.Len(), o.Seed), -1), o.GlobalBatch, true)

	var model *nn.Sequential
	if err := s.Scope(func(sc strategy.Scope) error {
		model, err = models.New(sc, o.Model, o.Hidden, int64(o.Seed))
		return err
	}); err != nil {
		return res, err
	}
	trainStep, err := s.Build(models.Spec, models.TrainStep(model, opt))
	if err != nil {
		return res, err
	}
	evalStep, err := s.Build(models.Spec, models.EvalStep(model))
	if err != nil {
		return res, err
	}

	// Resume from the latest checkpoint: its step is also the input
	// position, since the input order is a function of the seed.
	var backup *checkpoint.BackupAndRestore
	step := 0
	if o.CheckpointDir != "" {
		backup, err = checkpoint.NewBackupAndRestore(s, o.CheckpointDir, int64(o.CheckpointEvery), checkpoint.WithChief(isChief()))
		if err != nil {
			return res, err
		}
		done, err := backup.Restore(ctx)
		if err != nil {
			return res, err
		}
		if done > 0 {
			fmt.Fprintf(log, "resuming after step %d from %s\n", done, o.CheckpointDir)
		}
		step = int(min(done, int64(o.Steps)))
	}
	dist, err := s.DistributeDataset(dataset.Take(dataset.Skip(trainDS, step), o.Steps-step),
		dataset.WithShardPolicy(dataset.ShardData), dataset.WithPrefetch(2))
	if err != nil {
		return res, err
	}
	crash, err := crashPlanFromEnv()
	if err != nil {
		return res, err
	}
	armed := crash.armed()

	// Metrics: TensorBoard event files from the chief, progress on log.
	var tb *summary.Writer
	if o.LogDir != "" && isChief() {
		if tb, err = summary.NewWriter(o.LogDir); err != nil {
			return res, err
		}
		defer tb.Close()
	}
	var report *progress.Reporter
	if o.LogEvery > 0 {
		report = progress.New(log, o.Steps, o.GlobalBatch, progress.WithEvery(o.LogEvery), progress.WithInitialStep(step))
	}

	start, first := time.Now(), step
	for batch, err := range dist.All(ctx) {
		if err != nil {
			return res, err
		}
		out, err := s.Run(ctx, trainStep, batch)
		if err != nil {
			return res, fmt.Errorf("step %d: %w", step, err)
		}
		step++
		// The loss is summed across replicas (across workers, a collective
		// of its own) only when it is shown: at progress lines and the end.
		lossDue := step == o.Steps || o.LogEvery > 0 && step%o.LogEvery == 0
		if lossDue {
			loss, err := s.Reduce(ctx, strategy.Sum, out["loss"])
			if err != nil {
				return res, err
			}
			res.FinalLoss = float64(loss.Value().(float32))
			if err := tb.Scalar(int64(step), "loss", res.FinalLoss); err != nil {
				return res, err
			}
		}
		if backup != nil {
			if err := backup.AfterStep(ctx, int64(step)); err != nil {
				return res, err
			}
		}
		if armed {
			crash.crashIfDue(log, step)
		}
		if report != nil {
			report.Update(step, res.FinalLoss)
		}
	}
	if report != nil {
		if err := report.Close(); err != nil {
			return res, err
		}
	}
	if step != o.Steps {
		return res, fmt.Errorf("trained %d steps, expected %d", step, o.Steps)
	}
	if el := time.Since(start).Seconds(); el > 0 {
		res.ExamplesPerSec = float64((step-first)*o.GlobalBatch) / el
	}

	res.Accuracy, err = evaluate(ctx, s, evalStep, test, o.GlobalBatch)
	if err != nil {
		return res, err
	}
	if err := tb.Scalars(int64(step), map[string]float64{"accuracy": res.Accuracy, "examples_per_sec": res.ExamplesPerSec}); err != nil {
		return res, err
	}
	res.ParamL2, err = paramL2(ctx, model.Vars(), s.Value)
	return res, err
}

// evaluate returns the accuracy on test, each worker scoring its shard and
// the counts summed across all replicas.
func evaluate(ctx context.Context, s strategy.Strategy, step *strategy.Step, test digits.Data, batch int) (float64, error) {
	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	if err != nil {
		return 0, err
	}
	dist, err := s.DistributeDataset(dataset.Batched(ds, batch, false), dataset.WithShardPolicy(dataset.ShardData))
	if err != nil {
		return 0, err
	}
	var correct float64
	for b, err := range dist.All(ctx) {
		if err != nil {
			return 0, err
		}
		out, err := s.Run(ctx, step, b)
		if err != nil {
			return 0, err
		}
		sum, err := s.Reduce(ctx, strategy.Sum, out["correct"])
		if err != nil {
			return 0, err
		}
		correct += float64(sum.Value().(float32))
	}
	return correct / float64(test.Len()), nil
}
