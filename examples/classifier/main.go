// Command classifier trains a multi-layer perceptron on the UCI handwritten
// digits shipped with tfdist, under the strategy its flags name, with
// Keras's compile and fit (package train), and reports the held-out
// accuracy. It uses tfdist's public API only: copy it into a module of
// your own and build it (go build -o classifier .).
//
//	classifier -strategy mirrored -devices 2
//	classifier -epochs 5 -json
//	tfdist launch --workers 2 -- classifier -strategy multiworker
//	tfdist launch --chief --workers 2 --ps 1 -- classifier -strategy ps -epochs 30 -lr 0.02
//	classifier -strategy mirrored -devices 2 -export-dir /models/digits -export-version 1
//
// With the same seed and global batch, mirrored and multiworker end with
// the default strategy's model, up to float summation order: compare
// final_loss and param_l2 of the -json output. Under ps the workers train
// asynchronously, each step on gradients a little stale, hence a smaller
// rate over more epochs; an epoch is -steps-per-epoch steps (default: as
// many as a pass over the data takes). The same program runs on every
// task: on the ps and worker tasks it serves until the chief is done, and
// exits 0.
//
// -checkpoint-dir backs training up (train.BackupAndRestore) every
// -checkpoint-every steps and at the end of every epoch: after a failure,
// the same command resumes where the backup was taken. -export-dir writes
// the trained model as a SavedModel whose serving_default signature takes
// x (float32, [batch, 64]) and returns logits (float32, [batch, 10]).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/paramserver"
)

// options are the command's flags.
type options struct {
	dist            distribute.Config
	epochs          int
	stepsPerEpoch   int
	globalBatch     int
	lr              float64
	hidden          int
	seed            int64
	checkpointDir   string
	checkpointEvery int
	exportDir       string
	exportVersion   int64
	logLevel        string
	json            bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("classifier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.dist.RegisterFlags(fs)
	fs.IntVar(&o.epochs, "epochs", 10, "training epochs")
	fs.IntVar(&o.stepsPerEpoch, "steps-per-epoch", 0, "steps of each epoch (0: a pass over the training data; under ps, as many steps as a pass takes)")
	fs.IntVar(&o.globalBatch, "global-batch", 64, "examples per step, across every replica")
	fs.Float64Var(&o.lr, "lr", 0.05, "learning rate of SGD with momentum 0.9")
	fs.IntVar(&o.hidden, "hidden", 64, "units of the hidden layer")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the initial weights, the held-out split and the data order")
	fs.StringVar(&o.checkpointDir, "checkpoint-dir", "", "back training up into `DIR` and resume from its backup on start; the backup is deleted when training ends")
	fs.IntVar(&o.checkpointEvery, "checkpoint-every", 0, "with -checkpoint-dir: back up every `N` steps too (0: at the end of every epoch only)")
	fs.StringVar(&o.exportDir, "export-dir", "", "at the end, export the model as a SavedModel into `DIR` (signature serving_default: x float32 [batch, 64] to logits float32 [batch, 10]); the chief only")
	fs.Int64Var(&o.exportVersion, "export-version", 0, "with -export-dir: write TensorFlow Serving's layout DIR/`N` (0: the SavedModel in DIR itself; -1: one more than the largest version in DIR)")
	fs.StringVar(&o.logLevel, "log", "warn", "log the strategy's records at `LEVEL` or above to stderr: debug, info, warn or error")
	fs.BoolVar(&o.json, "json", false, "end with one JSON line of results on stdout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	return o, o.check()
}

// check reports the first flag whose value cannot work.
func (o options) check() error {
	switch {
	case !slices.Contains(distribute.Names, o.dist.Strategy):
		return fmt.Errorf("-strategy %q: expected one of %v", o.dist.Strategy, distribute.Names)
	case o.dist.Devices < 0:
		return fmt.Errorf("-devices %d: expected 0 or more", o.dist.Devices)
	case o.epochs < 1:
		return fmt.Errorf("-epochs %d: expected at least 1", o.epochs)
	case o.stepsPerEpoch < 0:
		return fmt.Errorf("-steps-per-epoch %d: expected 0 (a pass over the data) or more", o.stepsPerEpoch)
	case o.globalBatch < 1:
		return fmt.Errorf("-global-batch %d: expected at least 1", o.globalBatch)
	case !(o.lr > 0) || math.IsInf(o.lr, 0):
		return fmt.Errorf("-lr %v: expected a positive, finite learning rate", o.lr)
	case o.hidden < 1:
		return fmt.Errorf("-hidden %d: expected at least 1", o.hidden)
	case o.checkpointEvery < 0:
		return fmt.Errorf("-checkpoint-every %d: expected 0 (every epoch) or more", o.checkpointEvery)
	case o.exportVersion < -1:
		return fmt.Errorf("-export-version %d: expected a positive version, 0 for none or -1 for the next", o.exportVersion)
	case o.exportVersion != 0 && o.exportDir == "":
		return fmt.Errorf("-export-version %d: expected -export-dir too", o.exportVersion)
	}
	if _, err := zapcore.ParseLevel(o.logLevel); err != nil {
		return fmt.Errorf("-log %q: expected debug, info, warn or error", o.logLevel)
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it returns the process's exit code.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "classifier: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := trainWithFlags(ctx, o, stdout)
	if errors.Is(err, paramserver.ErrNotChief) {
		return 0 // a ps or worker task: it served the cluster until the chief was done
	}
	if err != nil {
		fmt.Fprintf(stderr, "classifier: %v\n", err)
		return 1
	}
	if !res.Chief {
		return 0 // the chief reports for every worker
	}
	fmt.Fprintf(stdout, "final loss %.4f, held-out accuracy %.2f%% (%d replicas, %d steps in %.1fs)\n",
		res.FinalLoss, 100*res.Accuracy, res.Replicas, res.Steps, res.Seconds)
	if res.ExportDir != "" {
		fmt.Fprintf(stdout, "SavedModel in %s (signature serving_default: x float32 [batch, 64] -> logits float32 [batch, 10])\n", res.ExportDir)
	}
	if o.json {
		line, err := json.Marshal(res)
		if err != nil {
			fmt.Fprintf(stderr, "classifier: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, string(line))
	}
	return 0
}

// trainWithFlags makes the strategy the flags name and trains under it.
func trainWithFlags(ctx context.Context, o options, stdout io.Writer) (result, error) {
	level, err := zapcore.ParseLevel(o.logLevel)
	if err != nil {
		return result{}, err
	}
	if o.dist.Logger, err = logging.NewConsole(level); err != nil {
		return result{}, err
	}
	defer o.dist.Logger.Sync()
	s, err := distribute.Open(ctx, o.dist)
	if err != nil {
		return result{}, err
	}
	defer s.Close()
	return fit(ctx, s, o, stdout)
}
