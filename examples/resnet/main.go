// Command resnet trains a small ResNet — a convolution, two residual
// blocks with batch normalisation, global average pooling and a dense
// classifier — on the 8x8 UCI handwritten digits shipped with tfdist,
// under the strategy its flags name, with the public API only:
//
//	resnet -strategy mirrored -devices 2
//	tfdist launch --workers 2 -- resnet -strategy multiworker -devices 1
//	tfdist launch --chief --workers 2 --ps 1 -- resnet -strategy ps
//
// It trains with train.Fit, as Keras's model.fit: -epochs epochs of
// -steps-per-epoch steps over the shuffled training set, repeated, with
// the held-out set as validation data. Under the synchronous strategies
// BatchNorm is synchronized (Keras' synchronized=True): its statistics
// cover the global batch, so N replicas train the model one device trains
// on the same global batches. Under parameter servers each worker's step
// runs on its own, so each normalises by its own batch, as Keras's
// BatchNormalization does under tf.distribute's ParameterServerStrategy.
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
	"syscall"
	"time"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// resnet defines the model: 16 filters throughout, so that every block
// adds its input to its output unchanged in shape; sync synchronizes the
// batch normalisation across replicas.
func resnet(filters int, sync bool) (in, out *nn.Tensor) {
	in = nn.Input(64)
	x := nn.Reshape{Shape: []int64{8, 8, 1}}.Call(in)
	x = convBN(x, filters, nn.ReLU, sync)
	for range 2 {
		h := convBN(x, filters, nn.ReLU, sync)
		h = convBN(h, filters, nn.Linear, sync)
		x = nn.ActivationLayer{Activation: nn.ReLU}.Call(nn.Add{}.Call(x, h))
	}
	x = nn.GlobalAveragePooling2D{}.Call(x)
	return in, nn.Dense{Units: 10}.Call(x)
}

// convBN is a 3x3 convolution, batch normalisation and act; the
// normalisation subtracts the mean, so the convolution has no bias.
func convBN(x *nn.Tensor, filters int, act nn.Activation, sync bool) *nn.Tensor {
	x = nn.Conv2D{Filters: filters, Kernel: 3, Padding: nn.Same, NoBias: true}.Call(x)
	x = nn.BatchNorm{Synchronized: sync}.Call(x)
	return nn.ActivationLayer{Activation: act}.Call(x)
}

// options are the command's flags.
type options struct {
	dist          distribute.Config
	epochs        int
	stepsPerEpoch int
	globalBatch   int
	filters       int
	lr            float64
	seed          int64
	policy        nn.Policy
	json          bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("resnet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.dist.RegisterFlags(fs)
	fs.IntVar(&o.epochs, "epochs", 10, "training epochs")
	fs.IntVar(&o.stepsPerEpoch, "steps-per-epoch", 100, "training steps of each epoch")
	fs.IntVar(&o.globalBatch, "global-batch", 64, "examples per step, across every replica")
	fs.IntVar(&o.filters, "filters", 16, "convolution filters of every layer")
	fs.Float64Var(&o.lr, "lr", 0.05, "initial learning rate of SGD with momentum 0.9, decayed to 0 along a half cosine over the run")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the initial values and the data order")
	fs.Var(&o.policy, "mixed-precision", "mixed-precision policy: float32, mixed_bfloat16 or mixed_float16 (with loss scaling)")
	fs.BoolVar(&o.json, "json", false, "print the result as one JSON line too")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.epochs < 1:
		return o, fmt.Errorf("-epochs %d: expected at least 1", o.epochs)
	case o.stepsPerEpoch < 1:
		return o, fmt.Errorf("-steps-per-epoch %d: expected at least 1", o.stepsPerEpoch)
	case o.globalBatch < 1:
		return o, fmt.Errorf("-global-batch %d: expected at least 1", o.globalBatch)
	case o.filters < 1:
		return o, fmt.Errorf("-filters %d: expected at least 1", o.filters)
	case o.dist.Strategy == "ps" && o.dist.Devices > 1:
		return o, fmt.Errorf("-strategy ps -devices %d: each worker runs its steps on one device", o.dist.Devices)
	}
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "resnet: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := distribute.Open(ctx, o.dist)
	if errors.Is(err, paramserver.ErrNotChief) {
		return 0 // a ps or worker task: it served the chief until the job ended
	}
	if err != nil {
		fmt.Fprintf(stderr, "resnet: %v\n", err)
		return 1
	}
	defer s.Close()
	res, err := fit(ctx, s, o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "resnet: %v\n", err)
		return 1
	}
	if !res.chief {
		return 0
	}
	fmt.Fprintf(stdout, "final loss %.4f, held-out accuracy %.2f%% (%d replicas, %.0f examples/s)\n",
		res.FinalLoss, 100*res.Accuracy, res.Replicas, res.ExamplesPerSec)
	if o.json {
		line, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(line))
	}
	return 0
}

// result is what a run reports.
type result struct {
	FinalLoss      float64 `json:"final_loss"`
	Accuracy       float64 `json:"accuracy"`
	Replicas       int     `json:"replicas"` // in sync, or the parameter-server job's workers
	ExamplesPerSec float64 `json:"examples_per_sec"`
	model          *nn.Model
	chief          bool // whether this process prints
}

// heldOut is the number of held-out examples, as the digits classifier
// holds out.
const heldOut = 297

// compile builds the model in s's scope and compiles it with SGD with
// momentum (and loss scaling under mixed_float16).
func compile(s distribute.Strategy, o options) (*train.Trainer, error) {
	_, ps := s.(*paramserver.Strategy)
	var model *nn.Model
	err := s.Scope(func(sc strategy.Scope) (err error) {
		in, out := resnet(o.filters, !ps)
		model, err = nn.NewModel(sc, "resnet", []*nn.Tensor{in}, []*nn.Tensor{out}, nn.WithSeed(o.seed))
		return err
	})
	if err != nil {
		return nil, err
	}
	lr := optimizer.CosineDecay{Initial: float32(o.lr), DecaySteps: int64(o.epochs * o.stepsPerEpoch)}
	var opt strategy.Optimizer = optimizer.NewKerasMomentum(lr, 0.9, false)
	if o.policy == nn.MixedFloat16 {
		if opt, err = optimizer.NewLossScale(opt); err != nil {
			return nil, err
		}
	}
	return train.Compile(s, model.WithPolicy(o.policy), train.SparseCategoricalCrossentropy{FromLogits: true}, opt,
		train.WithMetrics(train.SparseCategoricalAccuracy{}))
}

// data returns the shuffled training set in global batches, repeated, and
// the held-out set.
func data(o options) (trainSet, test dataset.Dataset, n int, err error) {
	d, err := digits.Load()
	if err != nil {
		return nil, nil, 0, err
	}
	tr, te := d.Split(heldOut, uint64(o.seed))
	if trainSet, err = dataset.FromSlices(map[string]any{"x": tr.X, "y": tr.Y}); err != nil {
		return nil, nil, 0, err
	}
	if test, err = dataset.FromSlices(map[string]any{"x": te.X, "y": te.Y}); err != nil {
		return nil, nil, 0, err
	}
	trainSet = dataset.Batched(dataset.Repeat(dataset.Shuffle(trainSet, tr.Len(), uint64(o.seed)), -1), o.globalBatch, true)
	return trainSet, dataset.Batched(test, o.globalBatch, false), tr.Len(), nil
}

// fit trains a new model on s as o says, printing its summary and
// progress to out on the chief, and reports the last epoch's loss and the held-out
// accuracy.
func fit(ctx context.Context, s distribute.Strategy, o options, out io.Writer) (result, error) {
	tr, err := compile(s, o)
	if err != nil {
		return result{}, err
	}
	if !tr.IsChief() {
		out = io.Discard
	}
	trainSet, test, _, err := data(o)
	if err != nil {
		return result{}, err
	}
	fmt.Fprint(out, tr.Model().Summary())
	start := time.Now()
	h, err := tr.Fit(ctx, trainSet, train.Epochs(o.epochs), train.StepsPerEpoch(o.stepsPerEpoch),
		train.ValidationData(test), train.WithCallbacks(train.NewProgressBar(out)))
	if err != nil {
		return result{}, err
	}
	last := len(h.Epochs) - 1
	return result{
		FinalLoss:      h.Values["loss"][last],
		Accuracy:       h.Values["val_accuracy"][last],
		Replicas:       distribute.NumReplicas(s),
		ExamplesPerSec: float64(o.epochs*o.stepsPerEpoch*o.globalBatch) / time.Since(start).Seconds(),
		model:          tr.Model(),
		chief:          tr.IsChief(),
	}, nil
}
