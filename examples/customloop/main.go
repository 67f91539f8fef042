// Command customloop is a custom training loop on the Mirrored strategy,
// written the way a tf.distribute user writes one: a functional model of nn
// layers and a step built with an nn.Builder, per-replica input
// pipelines from DistributeDatasetsFromFunction, a metric kept in an OnRead
// variable that every replica updates and that is summed when read, a
// learning-rate schedule, and a checkpoint manager that saves every epoch and
// resumes from the latest checkpoint when the program starts again. It uses
// the public API only: copy it into a module of your own.
//
//	customloop -dir /tmp/run -epochs 3     # trains epochs 1..3
//	customloop -dir /tmp/run -epochs 5     # resumes after epoch 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// options are the command's flags.
type options struct {
	dir         string
	epochs      int
	devices     int
	globalBatch int
	seed        uint64
	decayEpochs int // the learning rate decays over this many epochs, whatever -epochs says
}

// epochResult is what an epoch of training reports.
type epochResult struct {
	Epoch    int
	Loss     float64
	Accuracy float64 // on the epoch's training examples, from the OnRead metric
}

// report is what a run reports.
type report struct {
	ResumedAfter int // epochs restored from the checkpoint
	Epochs       []epochResult
	HeldOut      float64
	model        *nn.Model
}

// newModel defines the classifier: a hidden layer of 64 ReLU units, then
// the 10 logits, on the 64 pixels of a digit.
func newModel(sc strategy.Scope, seed int64) (*nn.Model, error) {
	in := nn.Input(digits.Features)
	h := nn.Dense{Units: 64, Activation: nn.ReLU}.Call(in)
	return nn.NewModel(sc, "mlp", []*nn.Tensor{in}, []*nn.Tensor{nn.Dense{Units: digits.Classes}.Call(h)}, nn.WithSeed(seed))
}

// inputs are what both steps read: x [batch, 64] float32 pixels and y
// [batch] int32 labels.
var inputs = strategy.InputSpec{
	"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}},
	"y": {DType: tf.Int32, Shape: []int64{-1}},
}

// run trains on s, resuming from o.dir's latest checkpoint, and scores the
// held-out digits.
func run(ctx context.Context, s *mirrored.Strategy, o options, log io.Writer) (report, error) {
	var rep report
	data, err := digits.Load()
	if err != nil {
		return rep, err
	}
	train, test := data.Split(297, o.seed)
	t, err := newTrainer(s, o, train)
	if err != nil {
		return rep, err
	}
	mgr, err := checkpoint.NewManager(s, o.dir, checkpoint.WithMaxToKeep(2))
	if err != nil {
		return rep, err
	}
	done, md, err := mgr.RestoreLatest(ctx)
	if err != nil {
		return rep, err
	}
	if epoch, ok := md.Int64("epoch"); ok {
		rep.ResumedAfter = int(epoch)
		fmt.Fprintf(log, "resumed after epoch %d (step %d)\n", epoch, done)
	}
	for epoch := rep.ResumedAfter + 1; epoch <= o.epochs; epoch++ {
		res, err := t.epoch(ctx, epoch)
		if err != nil {
			return rep, err
		}
		rep.Epochs = append(rep.Epochs, res)
		if _, err := mgr.Save(ctx, int64(epoch*t.stepsPerEpoch), checkpoint.Metadata{"epoch": int64(epoch)}); err != nil {
			return rep, err
		}
		fmt.Fprintf(log, "epoch %d: loss %.4f, training accuracy %.2f%%, saved\n", epoch, res.Loss, 100*res.Accuracy)
	}
	rep.model = t.model
	rep.HeldOut, err = heldOut(ctx, s, t.model, test)
	return rep, err
}

// trainer is what every epoch of the loop uses.
type trainer struct {
	o             options
	s             *mirrored.Strategy
	train         digits.Data
	stepsPerEpoch int
	perReplica    int // examples per replica and step
	model         *nn.Model
	correct, seen strategy.Variable // the metric: summed over replicas when read
	step          strategy.Step
}

// newTrainer creates the model and the metric in s and builds the
// training step.
func newTrainer(s *mirrored.Strategy, o options, train digits.Data) (*trainer, error) {
	t := &trainer{o: o, s: s, train: train, stepsPerEpoch: train.Len() / o.globalBatch}
	var err error
	if t.perReplica, err = s.InputContext().PerReplicaBatchSize(o.globalBatch); err != nil {
		return nil, err
	}
	if err := s.Scope(func(sc strategy.Scope) error {
		if t.model, err = newModel(sc, int64(o.seed)); err != nil {
			return err
		}
		metric := []strategy.VariableOption{strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum)}
		if t.correct, err = sc.Variable("metrics/correct", tf.Float, nil, strategy.Zeros(), metric...); err != nil {
			return err
		}
		t.seen, err = sc.Variable("metrics/seen", tf.Float, nil, strategy.Zeros(), metric...)
		return err
	}); err != nil {
		return nil, err
	}
	decay := optimizer.CosineDecay{Initial: 0.1, DecaySteps: int64(t.stepsPerEpoch * max(o.decayEpochs, 1)), Alpha: 0.1}
	t.step, err = s.Build(inputs, t.trainStep(optimizer.NewMomentum(decay, 0.9, false)))
	return t, err
}

// trainStep minimises the cross-entropy with opt and counts the examples
// seen and classified right into the metric.
func (t *trainer) trainStep(opt strategy.Optimizer) strategy.ReplicaFn {
	return func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := t.model.Apply(rc, in["x"], true)
		if err != nil {
			return nil, err
		}
		b := nn.NewBuilder(rc.Scope(), "train")
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(b.Op(), logits, in["y"], digits.Classes))
		if err := rc.AssignAdd(t.correct, b.SumAll(nn.Correct(b.Op(), logits, in["y"]))); err != nil {
			return nil, err
		}
		if err := rc.AssignAdd(t.seen, b.Count(in["y"], tf.Float)); err != nil {
			return nil, err
		}
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, t.model.Vars())
	}
}

// epoch resets the metric and trains one pass over the training data.
func (t *trainer) epoch(ctx context.Context, epoch int) (epochResult, error) {
	res := epochResult{Epoch: epoch}
	zero, err := tf.NewTensor(float32(0))
	if err != nil {
		return res, err
	}
	for _, v := range []strategy.Variable{t.correct, t.seen} {
		if err := t.s.Assign(ctx, v, zero); err != nil {
			return res, err
		}
	}
	// One pipeline per worker, batched per replica; the shuffle seed
	// depends on the epoch so a resumed run sees the same data.
	dist, err := t.s.DistributeDatasetsFromFunction(func(ic dataset.InputContext) (dataset.Dataset, error) {
		ds, err := dataset.FromSlices(map[string]any{"x": t.train.X, "y": t.train.Y})
		if err != nil {
			return nil, err
		}
		ds = dataset.Shard(ds, ic.NumInputPipelines, ic.InputPipelineID)
		return dataset.Batched(dataset.Shuffle(ds, t.train.Len(), t.o.seed+uint64(epoch)), t.perReplica, true), nil
	}, dataset.WithGlobalBatchSize(t.o.globalBatch))
	if err != nil {
		return res, err
	}
	for batch, err := range dist.All(ctx) {
		if err != nil {
			return res, err
		}
		out, err := t.s.Run(ctx, t.step, batch)
		if err != nil {
			return res, err
		}
		l, err := t.s.Reduce(ctx, strategy.Sum, out["loss"])
		if err != nil {
			return res, err
		}
		res.Loss = float64(strategy.TensorValue(l).(float32))
	}
	res.Accuracy, err = t.metric(ctx)
	return res, err
}

// metric reads the training accuracy the metric has counted.
func (t *trainer) metric(ctx context.Context) (float64, error) {
	c, err := t.s.Value(ctx, t.correct)
	if err != nil {
		return 0, err
	}
	n, err := t.s.Value(ctx, t.seen)
	if err != nil {
		return 0, err
	}
	return float64(strategy.TensorValue(c).(float32)) / float64(strategy.TensorValue(n).(float32)), nil
}

// heldOut scores the test set with an evaluation step on the same model,
// in batches of 64 (the last one smaller), with a metric that sums its
// counts over the replicas.
func heldOut(ctx context.Context, s *mirrored.Strategy, model *nn.Model, test digits.Data) (float64, error) {
	var acc *metrics.Accuracy
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		acc, err = metrics.NewAccuracy(sc, "metrics/held_out")
		return err
	}); err != nil {
		return 0, err
	}
	eval, err := s.Build(inputs, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := model.Apply(rc, in["x"], false)
		if err != nil {
			return nil, err
		}
		return nil, acc.Update(rc, logits, in["y"])
	})
	if err != nil {
		return 0, err
	}
	ds, err := dataset.FromSlices(map[string]any{"x": test.X, "y": test.Y})
	if err != nil {
		return 0, err
	}
	dist, err := s.DistributeDataset(dataset.Batched(ds, 64, false))
	if err != nil {
		return 0, err
	}
	res, err := metrics.Evaluate(ctx, s, eval, dist, acc)
	return res[acc.Name()], err
}

// onDevices runs the loop on o.devices logical CPUs.
func onDevices(ctx context.Context, o options, log io.Writer) (report, error) {
	s, err := mirrored.New(mirrored.WithLogicalCPUs(o.devices))
	if err != nil {
		return report{}, err
	}
	defer s.Close()
	return run(ctx, s, o, log)
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", "", "checkpoint directory (required): the loop resumes from its latest checkpoint")
	flag.IntVar(&o.epochs, "epochs", 3, "train until this epoch")
	flag.IntVar(&o.devices, "devices", 2, "logical CPU devices (replicas)")
	flag.IntVar(&o.globalBatch, "global-batch", 64, "examples per step across replicas")
	flag.Uint64Var(&o.seed, "seed", 1, "seed")
	flag.IntVar(&o.decayEpochs, "decay-epochs", 10, "epochs over which the learning rate decays (keep it fixed across resumed runs)")
	flag.Parse()
	if o.dir == "" {
		fmt.Fprintln(os.Stderr, "customloop: -dir is required")
		os.Exit(2)
	}
	rep, err := onDevices(context.Background(), o, os.Stdout)
	if err != nil {
		var me *checkpoint.MismatchError
		if errors.As(err, &me) {
			fmt.Fprintln(os.Stderr, "customloop: the checkpoint does not fit this model:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "customloop:", err)
		os.Exit(1)
	}
	fmt.Printf("held-out accuracy %.2f%%\n", 100*rep.HeldOut)
}
