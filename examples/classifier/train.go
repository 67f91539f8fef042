package main

import (
	"context"
	"fmt"
	"io"
	"time"

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

// heldOut is the number of examples kept out of training to score the
// model.
const heldOut = 297

// result is what a run reports: its -json line.
type result struct {
	Strategy    string  `json:"strategy"`
	Replicas    int     `json:"replicas"`
	Workers     int     `json:"workers"`
	GlobalBatch int     `json:"global_batch"`
	Epochs      int     `json:"epochs"`
	Steps       int64   `json:"steps"`
	FinalLoss   float64 `json:"final_loss"` // the last epoch's training loss
	Accuracy    float64 `json:"accuracy"`   // on the held-out examples
	ParamL2     float64 `json:"param_l2"`   // the L2 norm of the model's weights
	Seconds     float64 `json:"seconds"`    // Fit's wall time
	Chief       bool    `json:"chief"`
	// AppliedSteps is, under ps, how many updates the ps tasks applied.
	AppliedSteps int64 `json:"applied_steps,omitempty"`
	// ExportDir is the SavedModel's directory, on the task that wrote it.
	ExportDir string `json:"export_dir,omitempty"`
}

// newModel is the digits MLP: 64 pixels in, a ReLU hidden layer, 10
// logits out.
func newModel(sc strategy.Scope, hidden int, seed int64) (*nn.Model, error) {
	x := nn.Input(digits.Features)
	h := nn.Dense{Units: hidden, Activation: nn.ReLU}.Call(x)
	logits := nn.Dense{Units: digits.Classes}.Call(h)
	return nn.NewModel(sc, "mlp", []*nn.Tensor{x}, []*nn.Tensor{logits}, nn.WithSeed(seed))
}

// fit trains the model under s as o says, scores it on the held-out
// examples and exports it; the chief shows the progress on out.
func fit(ctx context.Context, s distribute.Strategy, o options, out io.Writer) (result, error) {
	all, err := digits.Load()
	if err != nil {
		return result{}, err
	}
	trainSet, test := all.Split(heldOut, uint64(o.seed))
	var model *nn.Model
	if err := s.Scope(func(sc strategy.Scope) error {
		model, err = newModel(sc, o.hidden, o.seed)
		return err
	}); err != nil {
		return result{}, err
	}
	tr, err := train.Compile(s, model, train.SparseCategoricalCrossentropy{FromLogits: true},
		optimizer.NewKerasMomentum(optimizer.Constant(float32(o.lr)), 0.9, false),
		train.WithMetrics(train.SparseCategoricalAccuracy{}))
	if err != nil {
		return result{}, err
	}
	defer tr.Close()
	res := result{Strategy: o.dist.Strategy, GlobalBatch: o.globalBatch, Epochs: o.epochs, Chief: tr.IsChief()}
	res.Replicas, res.Workers = replicas(s)
	if _, sync := s.(strategy.Strategy); sync && o.globalBatch%res.Replicas != 0 {
		return res, fmt.Errorf("-global-batch %d: expected a multiple of the %d replicas in sync", o.globalBatch, res.Replicas)
	}
	if err := fitAndScore(ctx, tr, o, trainSet, test, out, &res); err != nil {
		return res, err
	}
	if ps, ok := s.(*paramserver.Strategy); ok {
		if res.AppliedSteps, err = ps.AppliedSteps(ctx); err != nil {
			return res, err
		}
	}
	vr, ok := s.(strategy.ValueReader)
	if !ok {
		return res, fmt.Errorf("strategy %T cannot read its variables", s)
	}
	vals, err := strategy.ReadVariables(ctx, vr, model.Vars())
	if err != nil {
		return res, err
	}
	res.ParamL2 = strategy.GlobalNorm(vals)
	res.ExportDir, err = export(ctx, vr, model, o)
	return res, err
}

// fitAndScore trains with Fit, validating on test after every epoch, and
// scores the model on test.
func fitAndScore(ctx context.Context, tr *train.Trainer, o options, trainSet, test digits.Data, out io.Writer, res *result) error {
	ds, err := examples(trainSet)
	if err != nil {
		return err
	}
	ds = dataset.Batched(dataset.Shuffle(ds, trainSet.Len(), uint64(o.seed)), o.globalBatch, false)
	val, err := examples(test)
	if err != nil {
		return err
	}
	val = dataset.Batched(val, o.globalBatch, false)
	var callbacks []train.Callback
	if o.checkpointDir != "" {
		callbacks = append(callbacks, &train.BackupAndRestore{Dir: o.checkpointDir, SaveFreq: o.checkpointEvery})
	}
	callbacks = append(callbacks, train.NewProgressBar(out), &train.LambdaCallback{
		TrainEnd: func(_ context.Context, r *train.Run, _ train.Logs) error {
			res.Steps = r.Steps()
			return nil
		},
	})
	opts := []train.FitOption{train.Epochs(o.epochs), train.ValidationData(val), train.WithCallbacks(callbacks...)}
	steps := o.stepsPerEpoch
	if _, ps := tr.Strategy().(*paramserver.Strategy); ps && steps == 0 {
		steps = (trainSet.Len() + o.globalBatch - 1) / o.globalBatch // the coordinator needs a count
	}
	if steps > 0 {
		opts = append(opts, train.StepsPerEpoch(steps))
	}
	start := time.Now()
	hist, err := tr.Fit(ctx, ds, opts...)
	if err != nil {
		return err
	}
	res.Seconds = time.Since(start).Seconds()
	if loss := hist.Values["loss"]; len(loss) > 0 {
		res.FinalLoss = loss[len(loss)-1]
	}
	logs, err := tr.Evaluate(ctx, val, 0)
	res.Accuracy = logs["accuracy"]
	return err
}

// examples returns d as a dataset of x (the pixels) and y (the label).
func examples(d digits.Data) (dataset.Dataset, error) {
	return dataset.FromSlices(map[string]any{"x": d.X, "y": d.Y})
}

// replicas returns the number of replicas that train and of workers.
func replicas(s distribute.Strategy) (int, int) {
	switch s := s.(type) {
	case *paramserver.Strategy:
		return s.NumWorkers(), s.NumWorkers()
	case strategy.Strategy:
		return s.NumReplicasInSync(), s.InputContext().NumInputPipelines
	}
	return 1, 1
}

// export writes the model as a SavedModel under -export-dir and returns
// its directory ("" without one, or on a worker that does not write).
func export(ctx context.Context, s strategy.ValueReader, model *nn.Model, o options) (string, error) {
	if o.exportDir == "" {
		return "", nil
	}
	var opts []savedmodel.Option
	switch {
	case o.exportVersion == -1:
		opts = append(opts, savedmodel.WithNextVersion())
	case o.exportVersion > 0:
		opts = append(opts, savedmodel.WithVersion(o.exportVersion))
	}
	serving := savedmodel.Signature{
		Name:   savedmodel.DefaultSignature,
		Inputs: strategy.InputSpec{"x": {DType: model.Inputs()[0].DType, Shape: []int64{-1, digits.Features}}},
		Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			logits, err := model.Apply(r, in["x"], false)
			return strategy.Outputs{"logits": logits}, err
		},
	}
	return savedmodel.Export(ctx, s, o.exportDir, []savedmodel.Signature{serving}, opts...)
}
