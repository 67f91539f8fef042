// Command customloop is a custom training loop on the Mirrored strategy,
// written the way a tf.distribute user writes one: per-replica input
// pipelines from DistributeDatasetsFromFunction, a metric kept in an OnRead
// variable that every replica updates and that is summed when read, a
// learning-rate schedule, and a checkpoint manager that saves every epoch and
// resumes from the latest checkpoint when the program starts again.
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
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

type options struct {
	dir         string
	epochs      int
	devices     int
	globalBatch int
	seed        uint64
	decayEpochs int // the learning rate decays over this many epochs, whatever -epochs says
}

type epochResult struct {
	Epoch    int
	Loss     float64
	Accuracy float64 // on the epoch's training examples, from the OnRead metric
}

type report struct {
	ResumedAfter int // epochs restored from the checkpoint
	Epochs       []epochResult
	HeldOut      float64
}

func run(ctx context.Context, o options, log io.Writer) (report, error) {
	var rep report
	s, err := mirrored.New(mirrored.WithLogicalCPUs(o.devices))
	if err != nil {
		return rep, err
	}
	defer s.Close()
	per, err := s.InputContext().PerReplicaBatchSize(o.globalBatch)
	if err != nil {
		return rep, err
	}
	data, err := digits.Load()
	if err != nil {
		return rep, err
	}
	train, test := data.Split(297, o.seed)
	stepsPerEpoch := train.Len() / o.globalBatch

	var model *nn.MLP
	var correct, seen strategy.Variable
	if err := s.Scope(func(sc strategy.Scope) error {
		if model, err = nn.NewMLP(sc, "mlp", []int{digits.Features, 64, digits.Classes}, int64(o.seed)); err != nil {
			return err
		}
		metric := []strategy.VariableOption{strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum)}
		if correct, err = sc.Variable("metrics/correct", tf.Float, nil, strategy.Zeros(), metric...); err != nil {
			return err
		}
		seen, err = sc.Variable("metrics/seen", tf.Float, nil, strategy.Zeros(), metric...)
		return err
	}); err != nil {
		return rep, err
	}
	opt := optimizer.NewMomentum(optimizer.CosineDecay{Initial: 0.1, DecaySteps: int64(stepsPerEpoch * max(o.decayEpochs, 1)), Alpha: 0.1}, 0.9, false)
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}}, "y": {DType: tf.Int32, Shape: []int64{-1}}}
	step, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := model.Apply(rc, in["x"])
		if err != nil {
			return nil, err
		}
		sc := rc.Scope()
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(sc.SubScope("xent"), logits, in["y"], digits.Classes))
		hits := nn.Correct(sc.SubScope("hits"), logits, in["y"])
		if err := rc.AssignAdd(correct, op.Sum(sc.SubScope("n_correct"), hits, op.Const(sc.SubScope("axis"), int32(0)))); err != nil {
			return nil, err
		}
		n := op.Cast(sc.SubScope("n"), op.Size(sc.SubScope("size"), in["y"]), tf.Float)
		if err := rc.AssignAdd(seen, n); err != nil {
			return nil, err
		}
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, model.Vars())
	})
	if err != nil {
		return rep, err
	}
	zero, err := tf.NewTensor(float32(0))
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
		// The metric resets at the start of every epoch.
		for _, v := range []strategy.Variable{correct, seen} {
			if err := s.Assign(ctx, v, zero); err != nil {
				return rep, err
			}
		}
		// One pipeline per worker, batched per replica; the shuffle seed
		// depends on the epoch so a resumed run sees the same data.
		dist, err := s.DistributeDatasetsFromFunction(func(ic dataset.InputContext) (dataset.Dataset, error) {
			ds, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
			if err != nil {
				return nil, err
			}
			ds = dataset.Shard(ds, ic.NumInputPipelines, ic.InputPipelineID)
			return dataset.Batched(dataset.Shuffle(ds, train.Len(), o.seed+uint64(epoch)), per, true), nil
		}, dataset.WithGlobalBatchSize(o.globalBatch))
		if err != nil {
			return rep, err
		}
		var res epochResult
		res.Epoch = epoch
		for batch, err := range dist.All(ctx) {
			if err != nil {
				return rep, err
			}
			out, err := s.Run(ctx, step, batch)
			if err != nil {
				return rep, err
			}
			l, err := s.Reduce(ctx, strategy.Sum, out["loss"])
			if err != nil {
				return rep, err
			}
			res.Loss = float64(l.Value().(float32))
		}
		c, err := s.Value(ctx, correct)
		if err != nil {
			return rep, err
		}
		n, err := s.Value(ctx, seen)
		if err != nil {
			return rep, err
		}
		res.Accuracy = float64(c.Value().(float32)) / float64(n.Value().(float32))
		rep.Epochs = append(rep.Epochs, res)
		if _, err := mgr.Save(ctx, int64(epoch*stepsPerEpoch), checkpoint.Metadata{"epoch": int64(epoch)}); err != nil {
			return rep, err
		}
		fmt.Fprintf(log, "epoch %d: loss %.4f, training accuracy %.2f%%, saved\n", epoch, res.Loss, 100*res.Accuracy)
	}
	rep.HeldOut, err = heldOut(ctx, s, model, test)
	return rep, err
}

// heldOut scores the test set with a second step built on the same model.
func heldOut(ctx context.Context, s *mirrored.Strategy, model *nn.MLP, test digits.Data) (float64, error) {
	spec := strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}}, "y": {DType: tf.Int32, Shape: []int64{-1}}}
	eval, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := model.Apply(rc, in["x"])
		if err != nil {
			return nil, err
		}
		sc := rc.Scope()
		hits := op.Sum(sc.SubScope("sum"), nn.Correct(sc.SubScope("hits"), logits, in["y"]), op.Const(sc.SubScope("axis"), int32(0)))
		return strategy.Outputs{"hits": hits}, nil
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
	var hits float64
	for b, err := range dist.All(ctx) {
		if err != nil {
			return 0, err
		}
		out, err := s.Run(ctx, eval, b)
		if err != nil {
			return 0, err
		}
		h, err := s.Reduce(ctx, strategy.Sum, out["hits"])
		if err != nil {
			return 0, err
		}
		hits += float64(h.Value().(float32))
	}
	return hits / float64(test.Len()), nil
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
	rep, err := run(context.Background(), o, os.Stdout)
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
