package main

import (
	"context"
	"fmt"
	"io"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/metrics"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// report is what a run measured: the -json line.
type report struct {
	Strategy      string                   `json:"strategy"`
	Replicas      int                      `json:"replicas"`
	Steps         int                      `json:"steps"`
	GlobalBatch   int                      `json:"global_batch"`
	SeqLen        int                      `json:"seq_len"`
	Params        int64                    `json:"params"`
	TrainLoss     float64                  `json:"final_train_loss"` // nats per character, the mean of the last -log-every steps
	HeldOutLoss   float64                  `json:"held_out_loss"`    // nats per character
	HeldOutBits   float64                  `json:"held_out_bits"`
	HeldOutChars  int                      `json:"held_out_characters"` // the characters the held-out loss scores
	BigramEntropy float64                  `json:"bigram_entropy"`      // H(next | previous) of the training text, nats
	BigramEntBits float64                  `json:"bigram_entropy_bits"`
	BigramHeldOut float64                  `json:"bigram_held_out"` // the smoothed bigram model's held-out loss, nats
	TokensPerSec  float64                  `json:"tokens_per_sec"`  // training characters per second, after the first step
	TrainSeconds  float64                  `json:"train_seconds"`
	ParamL2       float64                  `json:"param_l2"` // the global norm of every variable of the model
	Sample        string                   `json:"sample,omitempty"`
	Losses        []float64                `json:"-"` // every step's training loss
	Variables     []strategy.VariableValue `json:"-"` // the model's variables after training
}

// trainer holds a run's model, metric and steps.
type trainer struct {
	s         strategy.Strategy
	o         options
	out       io.Writer // the chief's output; io.Discard on other workers
	model     *nn.Model
	heldOut   *metrics.Mean
	trainStep *strategy.Step
	evalStep  *strategy.Step
	logits    *strategy.Step
}

// train trains a model on s as o says, scores it on the held-out text and
// samples from it, printing progress to stdout on the chief.
func train(ctx context.Context, s strategy.Strategy, o options, stdout io.Writer) (report, error) {
	rep := report{Strategy: o.dist.Strategy, Replicas: s.NumReplicasInSync(), Steps: o.steps, GlobalBatch: o.globalBatch, SeqLen: o.seqLen}
	text, err := loadCorpus(o.corpus, int(o.trainBytes), int(o.evalBytes))
	if err != nil {
		return rep, err
	}
	t, err := newTrainer(s, o, stdout)
	if err != nil {
		return rep, err
	}
	data, err := t.distribute(text)
	if err != nil {
		return rep, err
	}
	t.describe(&rep, text)
	if err := t.fit(ctx, &rep, data.train); err != nil {
		return rep, err
	}
	if err := t.evaluate(ctx, &rep, data); err != nil {
		return rep, err
	}
	if rep.Sample, err = t.generate(ctx); err != nil {
		return rep, err
	}
	if o.sample > 0 {
		fmt.Fprintf(t.out, "sample (temperature %g):\n%s\n", o.temperature, rep.Sample)
	}
	if rep.Variables, err = t.variables(ctx); err != nil {
		return rep, err
	}
	rep.ParamL2 = strategy.GlobalNorm(rep.Variables)
	return rep, nil
}

// newTrainer builds the model and the held-out metric in s's scope, and
// the steps that train, score and sample.
func newTrainer(s strategy.Strategy, o options, stdout io.Writer) (*trainer, error) {
	t := &trainer{s: s, o: o, out: stdout}
	if !distribute.IsChief(s) {
		t.out = io.Discard
	}
	err := s.Scope(func(sc strategy.Scope) (err error) {
		if t.model, err = newModel(sc, o); err != nil {
			return err
		}
		t.heldOut, err = metrics.NewMean(sc, "held_out_loss")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("build the model: %w", err)
	}
	spec := strategy.InputSpec{"x": {DType: tf.Int32, Shape: []int64{-1, int64(o.seqLen)}}, "y": {DType: tf.Int32, Shape: []int64{-1, int64(o.seqLen)}}}
	if t.trainStep, err = s.Build(spec, t.trainFn(newOptimizer(o))); err != nil {
		return nil, fmt.Errorf("build the training step: %w", err)
	}
	if t.evalStep, err = s.Build(spec, t.evalFn()); err != nil {
		return nil, fmt.Errorf("build the evaluation step: %w", err)
	}
	if t.logits, err = s.Build(strategy.InputSpec{"x": spec["x"]}, t.logitsFn()); err != nil {
		return nil, fmt.Errorf("build the sampling step: %w", err)
	}
	return t, nil
}

// newModel is the Transformer language model: ids [batch, seqLen] to
// logits [batch, seqLen, vocabSize].
func newModel(sc strategy.Scope, o options) (*nn.Model, error) {
	ids := nn.InputOf(tf.Int32, int64(o.seqLen)).Named("ids")
	x := nn.TokenAndPositionEmbedding{VocabularySize: vocabSize, SequenceLength: o.seqLen, EmbeddingDim: o.width}.Call(ids)
	for range o.layers {
		h := nn.LayerNorm{}.Call(x)
		h = nn.MultiHeadAttention{NumHeads: o.heads, KeyDim: o.width / o.heads, UseCausalMask: true}.Call(h, h)
		x = nn.Add{}.Call(x, h)
		h = nn.LayerNorm{}.Call(x)
		h = nn.Dense{Units: 4 * o.width, Activation: nn.GELU}.Call(h)
		h = nn.Dense{Units: o.width}.Call(h)
		x = nn.Add{}.Call(x, h)
	}
	logits := nn.Dense{Units: vocabSize}.Call(nn.LayerNorm{}.Call(x))
	return nn.NewModel(sc, "transformer", []*nn.Tensor{ids}, []*nn.Tensor{logits}, nn.WithSeed(o.seed))
}

// newOptimizer is Adam on a learning rate that warms up linearly over
// -warmup steps, then decays along a cosine to a tenth by the last step.
func newOptimizer(o options) strategy.Optimizer {
	decay := optimizer.CosineDecay{Initial: float32(o.lr), DecaySteps: int64(max(o.steps-o.warmup, 1)), Alpha: 0.1}
	return optimizer.NewAdam(optimizer.Warmup{Steps: int64(o.warmup), Initial: 0, Then: decay})
}

// perCharacter returns the model's cross-entropy of every next character
// of in, flattened to [batch·seqLen].
func (t *trainer) perCharacter(r strategy.Replica, in strategy.Inputs, training bool) (tf.Output, error) {
	logits, err := t.model.Apply(r, in["x"], training)
	if err != nil {
		return tf.Output{}, err
	}
	b := nn.NewBuilder(r.Scope(), "loss")
	flat, labels := b.Reshape(logits, -1, vocabSize), b.Reshape(in["y"], -1)
	return nn.SparseSoftmaxCrossEntropy(b.Op(), flat, labels, vocabSize), b.Err()
}

// trainFn is the training step: the mean loss per character of the
// global batch, minimised with opt.
func (t *trainer) trainFn(opt strategy.Optimizer) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		perChar, err := t.perCharacter(r, in, true)
		if err != nil {
			return nil, err
		}
		// tf.nn.compute_average_loss: the sum over this replica's
		// characters divided by their number times the replicas in sync.
		loss, err := nn.ComputeAverageLoss(r, perChar)
		if err != nil {
			return nil, err
		}
		if err := r.ReduceOutput("loss", strategy.Sum, loss); err != nil {
			return nil, err
		}
		return nil, r.Minimize(opt, loss, t.model.Vars())
	}
}

// evalFn adds every held-out character's loss to the held-out metric.
func (t *trainer) evalFn() strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		perChar, err := t.perCharacter(r, in, false)
		if err != nil {
			return nil, err
		}
		return nil, t.heldOut.Update(r, perChar)
	}
}

// logitsFn returns the model's logits, for sampling.
func (t *trainer) logitsFn() strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := t.model.Apply(r, in["x"], false)
		return strategy.Outputs{"logits": logits}, err
	}
}

// describe prints the run's setting and the text's bigram statistics.
func (t *trainer) describe(rep *report, text corpus) {
	for _, v := range t.model.Vars() {
		n := int64(1)
		for _, d := range v.Shape() {
			n *= d
		}
		rep.Params += n
	}
	bg := bigram(text.train, text.eval)
	rep.BigramEntropy, rep.BigramEntBits, rep.BigramHeldOut = bg.Entropy, bits(bg.Entropy), bg.HeldOut
	if t.o.printSummary {
		fmt.Fprintln(t.out, t.model.Summary())
	}
	fmt.Fprintf(t.out, "corpus %s: %d training characters (%d files), %d held-out (%d files)\n",
		text.dir, len(text.train), text.trainFiles, len(text.eval), text.evalFiles)
	fmt.Fprintf(t.out, "bigram entropy H(next|previous) %.4f nats (%.4f bits) per character; smoothed bigram model on held-out text %.4f nats (%.4f bits); unigram %.4f nats\n",
		bg.Entropy, bits(bg.Entropy), bg.HeldOut, bits(bg.HeldOut), bg.Unigram)
	fmt.Fprintf(t.out, "model: %d blocks, width %d, %d heads, %d parameters; strategy %s, %d replicas; global batch %d × %d characters\n",
		t.o.layers, t.o.width, t.o.heads, rep.Params, t.o.dist.Strategy, rep.Replicas, t.o.globalBatch, t.o.seqLen)
}

// data is a run's input, divided among the workers and replicas.
type data struct {
	train     *dataset.Distributed // -steps global batches of shuffled training windows
	eval      *dataset.Distributed // every held-out window once, the last batch partial
	evalChars int                  // the held-out characters scored
}

// distribute divides the windows of the text among s's workers and
// replicas.
func (t *trainer) distribute(text corpus) (data, error) {
	var d data
	ds, n, err := t.sequences(text.train, "training text")
	if err != nil {
		return d, err
	}
	ds = dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, n, uint64(t.o.seed)), -1), t.o.globalBatch, true)
	if d.train, err = t.s.DistributeDataset(dataset.Take(ds, t.o.steps)); err != nil {
		return d, fmt.Errorf("training text: %w", err)
	}
	if ds, n, err = t.sequences(text.eval, "held-out text"); err != nil {
		return d, err
	}
	if d.eval, err = t.s.DistributeDataset(dataset.Batched(ds, t.o.globalBatch, false)); err != nil {
		return d, fmt.Errorf("held-out text: %w", err)
	}
	d.evalChars = n * t.o.seqLen
	return d, nil
}

// fit trains on every batch of dist, printing the loss.
func (t *trainer) fit(ctx context.Context, rep *report, dist *dataset.Distributed) error {
	var start, first time.Time
	step := 0
	for batch, err := range dist.All(ctx) {
		if err != nil {
			return fmt.Errorf("training text: step %d: %w", step+1, err)
		}
		if step == 0 {
			start = time.Now()
		}
		if err := t.runTrain(ctx, rep, batch); err != nil {
			return fmt.Errorf("step %d: %w", step+1, err)
		}
		if step++; step == 1 {
			first = time.Now()
		}
		t.progress(rep, step, first)
	}
	rep.TrainSeconds = time.Since(start).Seconds()
	return nil
}

// sequences returns the windows of ids (see windows) as a dataset of
// "x" and "y", and their number; text too short for one is an error.
func (t *trainer) sequences(ids []int32, what string) (dataset.Dataset, int, error) {
	x, y := windows(ids, t.o.seqLen)
	if len(x) == 0 {
		return nil, 0, fmt.Errorf("%s: %d characters, fewer than one sequence of %d", what, len(ids), t.o.seqLen+1)
	}
	ds, err := dataset.FromSlices(map[string]any{"x": x, "y": y})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", what, err)
	}
	return ds, len(x), nil
}

// runTrain runs one training step and records its loss.
func (t *trainer) runTrain(ctx context.Context, rep *report, batch *dataset.Batch) error {
	res, err := t.s.Run(ctx, t.trainStep, batch)
	if err != nil {
		return err
	}
	loss, ok := strategy.TensorValue(res.Reduced("loss")).(float32)
	if !ok {
		return fmt.Errorf("the loss is %T, expected a float32 scalar", strategy.TensorValue(res.Reduced("loss")))
	}
	rep.Losses = append(rep.Losses, float64(loss))
	return nil
}

// progress prints the mean training loss of the last -log-every steps,
// and the characters per second since the first step, when due.
func (t *trainer) progress(rep *report, step int, first time.Time) {
	if step%t.o.logEvery != 0 && step != t.o.steps {
		return
	}
	last := rep.Losses[max(len(rep.Losses)-t.o.logEvery, 0):]
	mean := 0.0
	for _, l := range last {
		mean += l / float64(len(last))
	}
	rep.TrainLoss = mean
	rate := ""
	if step > 1 {
		rep.TokensPerSec = float64((step-1)*t.o.globalBatch*t.o.seqLen) / time.Since(first).Seconds()
		rate = fmt.Sprintf("  %.0f characters/s", rep.TokensPerSec)
	}
	fmt.Fprintf(t.out, "step %4d/%d  loss %.4f nats (%.4f bits) per character%s\n", step, t.o.steps, mean, bits(mean), rate)
}

// evaluate scores every character of the held-out text once, each worker
// its own shard.
func (t *trainer) evaluate(ctx context.Context, rep *report, d data) error {
	res, err := metrics.Evaluate(ctx, t.s, t.evalStep, d.eval, t.heldOut)
	if err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	rep.HeldOutLoss = res[t.heldOut.Name()]
	rep.HeldOutBits, rep.HeldOutChars = bits(rep.HeldOutLoss), d.evalChars
	verdict := "below"
	if rep.HeldOutLoss >= rep.BigramEntropy {
		verdict = "NOT below"
	}
	fmt.Fprintf(t.out, "held-out loss %.4f nats (%.4f bits) per character over %d characters: %s the bigram entropy %.4f nats (%.4f bits)\n",
		rep.HeldOutLoss, rep.HeldOutBits, rep.HeldOutChars, verdict, rep.BigramEntropy, rep.BigramEntBits)
	return nil
}

// variables reads every variable of the model.
func (t *trainer) variables(ctx context.Context) ([]strategy.VariableValue, error) {
	vals, err := strategy.ReadVariables(ctx, t.s, t.model.Variables())
	if err != nil {
		return nil, fmt.Errorf("read the variables: %w", err)
	}
	return vals, nil
}
