// Command resnet trains a small ResNet — a convolution, two residual
// blocks with batch normalisation, global average pooling and a dense
// classifier — on the 8x8 UCI handwritten digits shipped with tfdist,
// under the strategy its flags name, with the public API only:
//
//	resnet -strategy mirrored -devices 2
//	tfdist launch --workers 2 -- resnet -strategy multiworker -devices 1
//
// BatchNorm is synchronized (Keras' synchronized=True): its statistics
// cover the global batch, so N replicas train the model one device trains
// on the same global batches.
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

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// resnet defines the model: 16 filters throughout, so that every block
// adds its input to its output unchanged in shape.
func resnet(filters int) (in, out *nn.Tensor) {
	in = nn.Input(64)
	x := nn.Reshape{Shape: []int64{8, 8, 1}}.Call(in)
	x = convBN(x, filters, nn.ReLU)
	for range 2 {
		h := convBN(x, filters, nn.ReLU)
		h = convBN(h, filters, nn.Linear)
		x = nn.ActivationLayer{Activation: nn.ReLU}.Call(nn.Add{}.Call(x, h))
	}
	x = nn.GlobalAveragePooling2D{}.Call(x)
	return in, nn.Dense{Units: 10}.Call(x)
}

// convBN is a 3x3 convolution, batch normalisation and act; the
// normalisation subtracts the mean, so the convolution has no bias.
func convBN(x *nn.Tensor, filters int, act nn.Activation) *nn.Tensor {
	x = nn.Conv2D{Filters: filters, Kernel: 3, Padding: nn.Same, NoBias: true}.Call(x)
	x = nn.BatchNorm{Synchronized: true}.Call(x)
	return nn.ActivationLayer{Activation: act}.Call(x)
}

// options are the command's flags.
type options struct {
	dist        distribute.Config
	steps       int
	globalBatch int
	filters     int
	lr          float64
	seed        int64
	policy      nn.Policy
	json        bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("resnet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.dist.RegisterFlags(fs)
	fs.IntVar(&o.steps, "steps", 1000, "training steps")
	fs.IntVar(&o.globalBatch, "global-batch", 64, "examples per step, across every replica")
	fs.IntVar(&o.filters, "filters", 16, "convolution filters of every layer")
	fs.Float64Var(&o.lr, "lr", 0.05, "learning rate of SGD with momentum 0.9")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the initial values and the data order")
	fs.Var(&o.policy, "mixed-precision", "mixed-precision policy: float32, mixed_bfloat16 or mixed_float16 (with loss scaling)")
	fs.BoolVar(&o.json, "json", false, "print the result as one JSON line too")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.steps < 1:
		return o, fmt.Errorf("-steps %d: expected at least 1", o.steps)
	case o.globalBatch < 1:
		return o, fmt.Errorf("-global-batch %d: expected at least 1", o.globalBatch)
	case o.filters < 1:
		return o, fmt.Errorf("-filters %d: expected at least 1", o.filters)
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
	s, err := distribute.New(ctx, o.dist)
	if err != nil {
		fmt.Fprintf(stderr, "resnet: %v\n", err)
		return 1
	}
	defer s.Close()
	out := io.Discard
	if distribute.IsChief(s) {
		out = stdout
	}
	res, err := train(ctx, s, o, true, out)
	if err != nil {
		fmt.Fprintf(stderr, "resnet: %v\n", err)
		return 1
	}
	fmt.Fprintf(out, "final loss %.4f, held-out accuracy %.2f%% (%d replicas, %.0f examples/s)\n",
		res.FinalLoss, 100*res.Accuracy, res.Replicas, res.ExamplesPerSec)
	if o.json {
		line, _ := json.Marshal(res)
		fmt.Fprintln(out, string(line))
	}
	return 0
}

// result is what a run reports.
type result struct {
	FinalLoss      float64 `json:"final_loss"`
	Accuracy       float64 `json:"accuracy"`
	Replicas       int     `json:"replicas"`
	ExamplesPerSec float64 `json:"examples_per_sec"`
	model          *nn.Model
}

// trainer is a model with its training and evaluation steps on one
// strategy.
type trainer struct {
	s     strategy.Strategy
	model *nn.Model
	acc   *metrics.Accuracy
	train *strategy.Step
	eval  *strategy.Step
}

// heldOut is the number of held-out examples, as the digits classifier
// holds out.
const heldOut = 297

var inputs = strategy.InputSpec{
	"x": {DType: tf.Float, Shape: []int64{-1, 64}},
	"y": {DType: tf.Int32, Shape: []int64{-1}},
}

func newTrainer(s strategy.Strategy, o options) (*trainer, error) {
	t := &trainer{s: s}
	err := s.Scope(func(sc strategy.Scope) (err error) {
		in, out := resnet(o.filters)
		if t.model, err = nn.NewModel(sc, "resnet", []*nn.Tensor{in}, []*nn.Tensor{out}, nn.WithSeed(o.seed)); err != nil {
			return err
		}
		t.model = t.model.WithPolicy(o.policy)
		t.acc, err = metrics.NewAccuracy(sc, "accuracy")
		return err
	})
	if err != nil {
		return nil, err
	}
	var opt strategy.Optimizer = optimizer.NewKerasMomentum(optimizer.Constant(o.lr), 0.9, false)
	if o.policy == nn.MixedFloat16 {
		if opt, err = optimizer.NewLossScale(opt); err != nil {
			return nil, err
		}
	}
	if t.train, err = s.Build(inputs, t.trainStep(opt)); err != nil {
		return nil, err
	}
	t.eval, err = s.Build(inputs, t.evalStep)
	return t, err
}

func (t *trainer) trainStep(opt strategy.Optimizer) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := t.model.Apply(r, in["x"], true)
		if err != nil {
			return nil, err
		}
		loss := r.AverageLoss(nn.SparseSoftmaxCrossEntropy(r.Scope().SubScope("loss"), logits, in["y"], 10))
		if err := r.ReduceOutput("loss", strategy.Sum, loss); err != nil {
			return nil, err
		}
		return nil, r.Minimize(opt, loss, t.model.Vars())
	}
}

func (t *trainer) evalStep(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
	logits, err := t.model.Apply(r, in["x"], false)
	if err != nil {
		return nil, err
	}
	return nil, t.acc.Update(r, logits, in["y"])
}

// train trains a new model on s as o says, printing progress to out, and
// reports the final loss; with evaluate, the held-out accuracy too.
func train(ctx context.Context, s strategy.Strategy, o options, evaluate bool, out io.Writer) (result, error) {
	t, err := newTrainer(s, o)
	if err != nil {
		return result{}, err
	}
	data, err := digits.Load()
	if err != nil {
		return result{}, err
	}
	trainSet, test := data.Split(heldOut, uint64(o.seed))
	fmt.Fprint(out, t.model.Summary())
	res := result{Replicas: s.NumReplicasInSync(), model: t.model}
	start := time.Now()
	if res.FinalLoss, err = t.fit(ctx, trainSet, o, out); err != nil || !evaluate {
		return res, err
	}
	res.ExamplesPerSec = float64(o.steps*o.globalBatch) / time.Since(start).Seconds()
	res.Accuracy, err = t.accuracy(ctx, test, o.globalBatch)
	return res, err
}

// fit runs o.steps steps on shuffled global batches of d and returns the
// last step's loss.
func (t *trainer) fit(ctx context.Context, d digits.Data, o options, out io.Writer) (float64, error) {
	ds, err := dataset.FromSlices(map[string]any{"x": d.X, "y": d.Y})
	if err != nil {
		return 0, err
	}
	ds = dataset.Take(dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, d.Len(), uint64(o.seed)), -1), o.globalBatch, true), o.steps)
	dist, err := t.s.DistributeDataset(ds)
	if err != nil {
		return 0, err
	}
	loss, step := 0.0, 0
	for batch, err := range dist.All(ctx) {
		if err != nil {
			return 0, err
		}
		res, err := t.s.Run(ctx, t.train, batch)
		if err != nil {
			return 0, fmt.Errorf("step %d: %w", step, err)
		}
		step++
		loss = float64(strategy.TensorValue(res.Reduced("loss")).(float32))
		if step%100 == 0 || step == o.steps {
			fmt.Fprintf(out, "step %4d/%d  loss %.4f\n", step, o.steps, loss)
		}
	}
	return loss, nil
}

// accuracy scores the held-out set, every example once across workers.
func (t *trainer) accuracy(ctx context.Context, test digits.Data, batch int) (float64, error) {
	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	if err != nil {
		return 0, err
	}
	dist, err := t.s.DistributeDataset(dataset.Batched(ds, batch, false))
	if err != nil {
		return 0, err
	}
	got, err := metrics.Evaluate(ctx, t.s, t.eval, dist, t.acc)
	if err != nil {
		return 0, err
	}
	return got["accuracy"], nil
}
