// Command lenet trains LeNet-5, scaled to 8x8 images, on the UCI
// handwritten digits shipped with tfdist, with train.Fit under the
// strategy its flags name, and prints its held-out accuracy. It uses the
// public API only: copy it into a module of your own.
//
//	lenet -strategy mirrored -devices 4
//	tfdist launch --workers 2 -- lenet -strategy multiworker -devices 2
//	tfdist launch --chief --workers 2 --ps 2 -- lenet -strategy ps -global-batch 32 -lr 0.02 -epochs 15
//
// The model is one functional definition for every strategy. With the
// same seed and global batch, every synchronous strategy ends with the
// model the default strategy trains, up to float summation order. Under
// parameter servers (-strategy ps) the same program runs as every task:
// the chief trains, the ps and worker tasks serve it.
//
// With -export-dir the trained model is written as a SavedModel whose
// serving_default signature takes x (float32, [batch, 64]) to logits
// (float32, [batch, 10]); -export-version N writes TensorFlow Serving's
// layout, DIR/N (-1: the next version).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// lenet5 defines LeNet-5 for 8x8 images: two 5x5 convolutions of 6 and 16
// filters, each followed by 2x2 max pooling, then dense layers of 120, 84
// and 10 units (the logits).
func lenet5() (in, out *nn.Tensor) {
	in = nn.Input(digits.Features)
	x := nn.Reshape{Shape: []int64{8, 8, 1}}.Call(in)
	x = nn.Conv2D{Filters: 6, Kernel: 5, Padding: nn.Same, Activation: nn.ReLU}.Call(x)
	x = nn.MaxPool2D{Size: 2}.Call(x)
	x = nn.Conv2D{Filters: 16, Kernel: 5, Padding: nn.Same, Activation: nn.ReLU}.Call(x)
	x = nn.MaxPool2D{Size: 2}.Call(x)
	x = nn.Flatten{}.Call(x)
	x = nn.Dense{Units: 120, Activation: nn.ReLU}.Call(x)
	x = nn.Dense{Units: 84, Activation: nn.ReLU}.Call(x)
	return in, nn.Dense{Units: digits.Classes}.Call(x)
}

// options are the command's flags.
type options struct {
	dist          distribute.Config
	epochs        int
	globalBatch   int
	optimizer     string
	lr            float64
	seed          int64
	json          bool
	exportDir     string
	exportVersion int64
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("lenet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.dist.RegisterFlags(fs)
	fs.IntVar(&o.epochs, "epochs", 10, "passes over the training data")
	fs.IntVar(&o.globalBatch, "global-batch", 64, "examples per step, across every replica")
	fs.StringVar(&o.optimizer, "optimizer", "sgd", "sgd (with momentum 0.9) or adam")
	fs.Float64Var(&o.lr, "lr", 0.05, "learning rate")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the initial weights, the data split and the shuffle")
	fs.BoolVar(&o.json, "json", false, "print the result as one JSON line too")
	fs.StringVar(&o.exportDir, "export-dir", "", "export the trained model as a SavedModel into `DIR` (the chief only)")
	fs.Int64Var(&o.exportVersion, "export-version", 0, "with -export-dir: write DIR/`N` (0: DIR itself; -1: the next version)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.epochs < 1:
		return o, fmt.Errorf("-epochs %d: expected at least 1", o.epochs)
	case o.globalBatch < 1:
		return o, fmt.Errorf("-global-batch %d: expected at least 1", o.globalBatch)
	case !slices.Contains([]string{"sgd", "adam"}, o.optimizer):
		return o, fmt.Errorf("-optimizer %q: expected sgd or adam", o.optimizer)
	case o.lr <= 0:
		return o, fmt.Errorf("-lr %g: expected a positive rate", o.lr)
	case o.exportVersion < -1 || o.exportVersion != 0 && o.exportDir == "":
		return o, fmt.Errorf("-export-version %d: expected -export-dir and a positive version, 0 for none or -1 for the next", o.exportVersion)
	case o.dist.Strategy == "ps" && o.dist.Devices > 1:
		return o, fmt.Errorf("-strategy ps -devices %d: each worker runs its steps on one device", o.dist.Devices)
	}
	return o, nil
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
		fmt.Fprintf(stderr, "lenet: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := distribute.Open(ctx, o.dist)
	if errors.Is(err, paramserver.ErrNotChief) {
		return 0 // a ps or worker task: it served the chief until the job ended
	}
	if err != nil {
		fmt.Fprintf(stderr, "lenet: %v\n", err)
		return 1
	}
	defer s.Close()
	res, err := fit(ctx, s, o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "lenet: %v\n", err)
		return 1
	}
	if res.chief {
		fmt.Fprintf(stdout, "held-out accuracy %.2f%% after %d epochs (loss %.4f)\n", 100*res.Accuracy, res.Epochs, res.Loss)
		if o.json {
			line, _ := json.Marshal(res)
			fmt.Fprintln(stdout, string(line))
		}
	}
	return 0
}

// result is what a run reports (the -json line).
type result struct {
	Epochs    int     `json:"epochs"`
	Loss      float64 `json:"loss"`     // the last epoch's training loss
	Accuracy  float64 `json:"accuracy"` // on the held-out digits
	ExportDir string  `json:"export_dir,omitempty"`
	chief     bool
	trainer   *train.Trainer
}

// heldOut is the number of held-out examples.
const heldOut = 297

// fit trains LeNet-5 on s as o says, showing its progress on out on the
// chief, and scores it on the held-out digits.
func fit(ctx context.Context, s distribute.Strategy, o options, out io.Writer) (result, error) {
	tr, err := compile(s, o)
	if err != nil {
		return result{}, err
	}
	defer tr.Close()
	res := result{Epochs: o.epochs, chief: tr.IsChief(), trainer: tr}
	if !res.chief {
		out = io.Discard
	}
	fmt.Fprint(out, tr.Model().Summary())
	data, err := digits.Load()
	if err != nil {
		return res, err
	}
	trainSet, test := data.Split(heldOut, uint64(o.seed))
	ds, val, err := batches(trainSet, test, o)
	if err != nil {
		return res, err
	}
	opts := []train.FitOption{train.Epochs(o.epochs), train.ValidationData(val), train.WithCallbacks(train.NewProgressBar(out))}
	if _, ok := s.(*paramserver.Strategy); ok { // its workers read the data endlessly: say where epochs end
		opts = append(opts, train.StepsPerEpoch(trainSet.Len()/o.globalBatch))
	}
	h, err := tr.Fit(ctx, ds, opts...)
	if err != nil {
		return res, err
	}
	res.Loss, res.Accuracy = last(h, "loss"), last(h, "val_accuracy")
	if o.exportDir != "" {
		res.ExportDir, err = export(ctx, tr, o)
	}
	return res, err
}

// compile makes LeNet-5 in s and compiles it with the optimizer o names.
func compile(s distribute.Strategy, o options) (*train.Trainer, error) {
	var model *nn.Model
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		in, out := lenet5()
		model, err = nn.NewModel(sc, "lenet5", []*nn.Tensor{in}, []*nn.Tensor{out}, nn.WithSeed(o.seed))
		return err
	}); err != nil {
		return nil, err
	}
	var opt strategy.Optimizer = optimizer.NewKerasMomentum(optimizer.Constant(o.lr), 0.9, false)
	if o.optimizer == "adam" {
		opt = optimizer.NewAdam(optimizer.Constant(o.lr))
	}
	return train.Compile(s, model, train.SparseCategoricalCrossentropy{FromLogits: true}, opt,
		train.WithMetrics(train.SparseCategoricalAccuracy{}))
}

// batches returns the training examples, reshuffled every epoch, and the
// held-out ones, both in global batches of x and y.
func batches(trainSet, test digits.Data, o options) (ds, val dataset.Dataset, err error) {
	if ds, err = dataset.FromSlices(map[string]any{"x": trainSet.X, "y": trainSet.Y}); err != nil {
		return nil, nil, err
	}
	if val, err = dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y}); err != nil {
		return nil, nil, err
	}
	ds = dataset.Shuffle(ds, trainSet.Len(), uint64(o.seed))
	return dataset.Batched(ds, o.globalBatch, false), dataset.Batched(val, o.globalBatch, false), nil
}

// last returns the last epoch's value of key.
func last(h *train.History, key string) float64 {
	v := h.Values[key]
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}

// export writes the trained model as a SavedModel into o.exportDir and
// returns its directory. Every worker calls it; the chief writes.
func export(ctx context.Context, tr *train.Trainer, o options) (string, error) {
	m := tr.Model()
	sig := savedmodel.Signature{
		Name:   savedmodel.DefaultSignature,
		Inputs: strategy.InputSpec{"x": {DType: m.Inputs()[0].DType, Shape: []int64{-1, digits.Features}}},
		Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := m.Apply(r, in["x"], false)
			return strategy.Outputs{"logits": logits}, err
		},
	}
	var opts []savedmodel.Option
	switch {
	case o.exportVersion < 0:
		opts = append(opts, savedmodel.WithNextVersion())
	case o.exportVersion > 0:
		opts = append(opts, savedmodel.WithVersion(o.exportVersion))
	}
	src, ok := tr.Strategy().(strategy.ValueReader)
	if !ok {
		return "", fmt.Errorf("export: strategy %T cannot read its variables", tr.Strategy())
	}
	return savedmodel.Export(ctx, src, o.exportDir, []savedmodel.Signature{sig}, opts...)
}
