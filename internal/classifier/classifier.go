// Package classifier is the digits classifier behind internal/cmd/digits
// (the test bed `tfdist soak` runs), `tfdist demo` and `tfdist bench`: a
// model of package models (the MLP, or the LeNet CNN) trained on the UCI
// handwritten digits under any strategy — default, mirrored, multiworker
// or ps — with the same flags everywhere, by the one training loop of
// package trainloop. With the same seed, data order and global batch,
// every synchronous strategy ends with the default strategy's model, up to
// float summation order: compare FinalLoss, and Variables element by
// element (strategy.MaxDiff).
package classifier

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/trainloop"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/progress"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/summary"
	"github.com/tfdist/tfdist/timeline"
)

// Options are the classifier's flags.
type Options struct {
	Strategy string
	Model    string
	Devices  int
	// Deterministic is the virtual shards of topology-invariant training
	// (the strategies' WithDeterministic); 0 is off.
	Deterministic int
	GlobalBatch   int
	Steps         int
	LR            float64
	Optimizer     string
	Seed          uint64
	Hidden        int
	TestSize      int
	LogEvery      int
	JSON          bool

	LogDir            string
	CheckpointDir     string
	CheckpointEvery   int
	CollectiveTimeout time.Duration
	StepTimeout       time.Duration
	Communication     string
	StatsEvery        time.Duration
	LogLevel          string
	ExportDir         string
	ExportVersion     int64
	Aggregation       string
	Compression       string

	// Large-batch training: see optim.go.
	WarmupSteps    int
	ClipNorm       float64
	Accumulate     int
	MixedPrecision nn.Policy

	// Differential privacy: see dp.go.
	DP DP
	dp *privacy // set once the strategy is known

	// Faults injected on purpose, by tests only: see fault.go.
	Faults Faults
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
	// ParamsSHA256 fingerprints every element of every variable of the
	// model, trainable or not (BatchNorm's moving statistics), with
	// strategy.Fingerprint: tasks that hold the same model, bit for bit,
	// report the same. ParamL2, the variables' global norm, is a summary,
	// blind to elements permuted or negated.
	ParamsSHA256 string `json:"params_sha256"`
	// Epsilon and Delta are, under -dp-clip, the privacy the run spent,
	// and NoiseMultiplier the noise it trained with.
	Epsilon         float64 `json:"epsilon,omitempty"`
	Delta           float64 `json:"delta,omitempty"`
	NoiseMultiplier float64 `json:"noise_multiplier,omitempty"`
	// AppliedSteps is, under -strategy ps, how many updates the ps tasks applied.
	AppliedSteps int64 `json:"applied_steps,omitempty"`
	// Aggregation is the rule of -aggregation, and DiscardedVotes counts,
	// per worker, the steps whose gradient did not count fully.
	Aggregation    string  `json:"aggregation,omitempty"`
	DiscardedVotes []int64 `json:"discarded_votes,omitempty"`
	// StepTimes are how long the training steps this task ran took.
	StepTimes *StepTimes `json:"step_times,omitempty"`
	// Breakdown splits this task's time into its phases, when its
	// strategy kept a timeline (tfdist launch --timeline).
	Breakdown *timeline.Breakdown `json:"breakdown,omitempty"`
	// ExportDir is, under -export-dir, the directory of the SavedModel
	// this task wrote ("" on a worker other than the chief).
	ExportDir string `json:"export_dir,omitempty"`
	// Variables are the values of the model's variables after training.
	Variables []strategy.VariableValue `json:"-"`
}

// RegisterFlags defines the classifier's flags on fs, storing into o.
func RegisterFlags(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.Strategy, "strategy", "default", "distribution strategy: default, mirrored, multiworker, ps, or elastic (multiworker in an elastic job: tfdist launch --elastic)")
	if o.Model == "" {
		o.Model = "mlp"
	}
	fs.StringVar(&o.Model, "model", o.Model, fmt.Sprintf("model: one of %v", models.Names))
	fs.IntVar(&o.Devices, "devices", 1, "replicas per process (logical CPU devices)")
	fs.IntVar(&o.GlobalBatch, "global-batch", 64, "examples per step across all replicas")
	fs.IntVar(&o.Steps, "steps", 300, "training steps")
	fs.Float64Var(&o.LR, "lr", 0.1, "learning rate")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the initial weights, the data split and the shuffle")
	fs.IntVar(&o.Hidden, "hidden", 64, "hidden units")
	fs.IntVar(&o.TestSize, "test-size", 297, "held-out examples")
	fs.IntVar(&o.LogEvery, "log-every", 50, "print progress every N steps (0: never)")
	fs.BoolVar(&o.JSON, "json", false, "end with one JSON line of results on stdout")
	fs.StringVar(&o.LogDir, "logdir", "", "write TensorBoard event files (loss, accuracy, examples/s) into this directory; the chief only")
	fs.StringVar(&o.ExportDir, "export-dir", "", "at the end, export the model as a SavedModel into `DIR` (signature serving_default: x float32 [batch, 64] to logits float32 [batch, 10]); the chief only")
	fs.Int64Var(&o.ExportVersion, "export-version", 0, "with -export-dir: write TensorFlow Serving's layout DIR/`N` (0: the SavedModel in DIR itself; -1: one more than the largest version in DIR)")
	fs.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "checkpoint here every -checkpoint-every steps and resume from the latest checkpoint on start")
	fs.IntVar(&o.CheckpointEvery, "checkpoint-every", 50, "steps between checkpoints")
	fs.DurationVar(&o.CollectiveTimeout, "collective-timeout", 60*time.Second, "multiworker: how long a step waits for its peers before failing and naming a dead or silent one (0: forever)")
	fs.DurationVar(&o.StepTimeout, "step-timeout", 0, "in-graph strategies: the deadline of each step's run, through its context (0: none); a step past it fails the run")
	fs.StringVar(&o.LogLevel, "log", "warn", "log the strategy's records at `LEVEL` or above to stderr: debug, info (with the audit trail of peers joining, leaving or refused), warn or error")
	fs.StringVar(&o.Communication, "communication", "tfdist", "multiworker: who moves tensors between workers: tfdist (its own collective engine) or tensorflow (TensorFlow's ring collectives)")
	registerLargeBatchFlags(fs, o)
	registerPrivacyFlags(fs, &o.DP)
	registerRobustFlags(fs, o)
	fs.IntVar(&o.Deterministic, "deterministic", 0, "virtual shards, a power of two, for the same model bit for bit on any number of devices and workers dividing it (0: off)")
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
	case o.StepTimeout < 0:
		return fmt.Errorf("-step-timeout %v: expected a positive duration, or 0 for none", o.StepTimeout)
	case o.Communication != "tfdist" && o.Communication != "tensorflow":
		return fmt.Errorf("-communication %q: expected tfdist or tensorflow", o.Communication)
	case o.ExportVersion < -1:
		return fmt.Errorf("-export-version %d: expected a positive version, 0 for none or -1 for the next", o.ExportVersion)
	case o.ExportVersion != 0 && o.ExportDir == "":
		return fmt.Errorf("-export-version %d: expected -export-dir too", o.ExportVersion)
	case o.StatsEvery < 0:
		return fmt.Errorf("-stats-every %v: expected a positive duration, or 0 for none", o.StatsEvery)
	case o.Strategy == "elastic" && (o.CheckpointDir != "" || o.Communication != "tfdist" || o.DP.on()):
		return errors.New("-strategy elastic keeps its state in memory, on tfdist's engine: drop -checkpoint-dir, -communication tensorflow and DP-SGD's flags")
	}
	if err := o.DP.check(o); err != nil {
		return err
	}
	if err := o.Faults.check(); err != nil {
		return err
	}
	if _, err := o.gradientOptions(); err != nil {
		return err
	}
	if _, err := o.logger(); err != nil {
		return err
	}
	return o.checkLargeBatch()
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

// Run trains and evaluates; progress goes to log, results to the caller.
// On a ps or worker task of a parameter-server cluster it serves until the
// chief is done and returns paramserver.ErrNotChief.
func Run(ctx context.Context, o Options, log io.Writer) (Result, error) {
	if o.StatsEvery > 0 {
		defer reportStats(log, o.StatsEvery)()
	}
	res := Result{Strategy: o.Strategy, GlobalBatch: o.GlobalBatch, Steps: o.Steps}
	if err := o.Faults.check(); err != nil {
		return res, err
	}
	data, err := digits.Load()
	if err != nil {
		return res, err
	}
	train, test := data.Split(o.TestSize, o.Seed)
	var sess session
	switch o.Strategy {
	case "elastic":
		return res, runElastic(ctx, o, train, test, &res, log)
	case "ps":
		sess, err = newPSSession(ctx, o, train, &res)
	default:
		sess, err = newInGraphSession(ctx, o, train, &res)
	}
	if err != nil {
		return res, err
	}
	defer sess.close()
	return res, trainAndScore(ctx, o, sess, test, &res, log)
}

// trainAndScore trains sess's model, scores it on test and fills in res.
func trainAndScore(ctx context.Context, o Options, sess session, test digits.Data, res *Result, log io.Writer) error {
	var tb *summary.Writer
	if o.LogDir != "" && res.Chief {
		var err error
		if tb, err = summary.NewWriter(o.LogDir); err != nil {
			return err
		}
		defer tb.Close()
	}
	if err := trainModel(ctx, o, sess, tb, res, log); err != nil {
		return err
	}
	var err error
	if res.Accuracy, err = sess.evaluate(ctx, test); err != nil {
		return err
	}
	if err := tb.Scalars(int64(o.Steps), map[string]float64{"accuracy": res.Accuracy, "examples_per_sec": res.ExamplesPerSec}); err != nil {
		return err
	}
	if res.ExportDir, err = export(ctx, o, sess); err != nil {
		return err
	}
	if res.Variables, err = strategy.ReadVariables(ctx, sess.strategy(), sess.model().Variables()); err != nil {
		return fmt.Errorf("reading the trained model: %w", err)
	}
	res.ParamL2, res.ParamsSHA256 = strategy.GlobalNorm(res.Variables), strategy.Fingerprint(res.Variables)
	return nil
}

// export writes the trained model as a SavedModel, under -export-dir.
func export(ctx context.Context, o Options, sess session) (string, error) {
	if o.ExportDir == "" {
		return "", nil
	}
	var opts []savedmodel.Option
	switch {
	case o.ExportVersion == -1:
		opts = append(opts, savedmodel.WithNextVersion())
	case o.ExportVersion > 0:
		opts = append(opts, savedmodel.WithVersion(o.ExportVersion))
	}
	return savedmodel.Export(ctx, sess.strategy(), o.ExportDir, []savedmodel.Signature{models.ServingSignature(sess.model())}, opts...)
}

// session is one strategy's part of a run: its model, steps, checkpoints
// and evaluation. Run and trainModel do the rest, the same for every
// strategy.
type session interface {
	// model returns the model being trained.
	model() *nn.Sequential
	// restore restores the latest checkpoint, when the run checkpoints,
	// and returns the number of steps it had done (0 without one).
	restore(ctx context.Context) (int, error)
	// trainer returns the Trainer of the steps after start, which adds
	// each step's duration to times, and the most steps one chunk may run
	// (0: any number).
	trainer(ctx context.Context, start int, times *stepTimes) (trainloop.Trainer, int, error)
	// checkpoint saves a checkpoint after step, when the run checkpoints.
	checkpoint(ctx context.Context, step int) error
	// finish adds to res what the strategy knows at the end of training.
	finish(ctx context.Context, res *Result, log io.Writer) error
	// evaluate returns the model's accuracy on test.
	evaluate(ctx context.Context, test digits.Data) (float64, error)
	// strategy returns the strategy that trains the model.
	strategy() strategy.ValueReader
	// privacy returns the run's DP-SGD accounting, nil without DP-SGD.
	privacy() *privacy
	// close releases the session.
	close() error
}

// trainModel resumes from the latest checkpoint, when the run
// checkpoints, and trains with the shared loop up to -steps.
func trainModel(ctx context.Context, o Options, sess session, tb *summary.Writer, res *Result, log io.Writer) error {
	start, err := sess.restore(ctx)
	if err != nil {
		return err
	}
	if start > 0 && o.CheckpointDir != "" {
		fmt.Fprintf(log, "resuming after step %d from %s\n", start, o.CheckpointDir)
	} else if start > 0 {
		fmt.Fprintf(log, "resuming after step %d\n", start)
	}
	start = min(start, o.Steps)
	var times stepTimes
	trainer, maxChunk, err := sess.trainer(ctx, start, &times)
	if err != nil {
		return err
	}
	c := trainloop.Config{Steps: o.Steps, Start: start, MaxChunk: maxChunk, GlobalBatch: o.GlobalBatch,
		LogEvery: o.LogEvery, Log: log, CheckpointEvery: o.CheckpointEvery,
		OnLoss: func(step int, loss float64) error {
			scalars := map[string]float64{"loss": loss}
			maps.Copy(scalars, aggregationResult(sess.strategy(), res))
			if p := sess.privacy(); p != nil {
				scalars["epsilon"] = p.epsilon(step)
			}
			return tb.Scalars(int64(step), scalars)
		}}
	if p := sess.privacy(); p != nil {
		c.Progress = append(c.Progress, progress.WithMetric("ε", p.epsilon))
	}
	if o.CheckpointDir != "" {
		c.Checkpoint = sess.checkpoint
	}
	if o.Faults.armed() {
		c.AfterChunk = func(step int) { o.Faults.crashIfDue(log, step) }
	}
	out, err := trainloop.Run(ctx, trainer, c)
	if err != nil {
		return err
	}
	res.FinalLoss, res.ExamplesPerSec, res.StepTimes = out.Loss, out.ExamplesPerSec, times.summary()
	aggregationResult(sess.strategy(), res)
	if p := sess.privacy(); p != nil {
		res.Epsilon, res.Delta, res.NoiseMultiplier = p.epsilon(o.Steps), p.Delta, p.Noise
	}
	return sess.finish(ctx, res, log)
}

// built is a model and its steps, as a strategy builds them.
type built[F any] struct {
	m           *nn.Sequential
	acc         *metrics.Accuracy // nil unless asked for
	train, eval F
}

// buildModel creates the model of the flags in a strategy's scope, with
// an accuracy metric when withAccuracy is set, and builds its train and
// eval steps with the strategy's build.
func buildModel[F any](o Options, scope func(func(strategy.Scope) error) error,
	build func(strategy.InputSpec, strategy.ReplicaFn) (F, error), withAccuracy bool) (b built[F], err error) {
	opt, err := newOptimizer(o)
	if err != nil {
		return b, err
	}
	if err = scope(func(sc strategy.Scope) error {
		if b.m, err = models.New(sc, o.Model, o.Hidden, int64(o.Seed)); err != nil || !withAccuracy {
			return err
		}
		b.acc, err = metrics.NewAccuracy(sc, "metrics/accuracy")
		return err
	}); err != nil {
		return b, err
	}
	b.m = b.m.WithPolicy(o.MixedPrecision)
	if b.train, err = build(models.Spec, models.PoisonedTrainStep(b.m, opt, o.poisoned, o.minimizeOptions()...)); err != nil {
		return b, err
	}
	b.eval, err = build(models.Spec, models.EvalStep(b.m, b.acc))
	return b, err
}

// logger returns the logger of the strategy's records, to stderr at
// -log's level (nop when the level is empty, as in tests that fill
// Options by hand).
func (o Options) logger() (*zap.Logger, error) {
	if o.LogLevel == "" {
		return zap.NewNop(), nil
	}
	level, err := zapcore.ParseLevel(o.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("-log %q: expected debug, info, warn or error", o.LogLevel)
	}
	return logging.NewConsole(level)
}
