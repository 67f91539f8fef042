package main

import (
	"context"
	"fmt"
	"io"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// report is what a run measured: the -json line. Losses are in nats per
// character.
type report struct {
	Strategy      string                   `json:"strategy"`
	Replicas      int                      `json:"replicas"` // in sync; under parameter servers, the workers
	Steps         int                      `json:"steps"`
	GlobalBatch   int                      `json:"global_batch"`
	SeqLen        int                      `json:"seq_len"`
	Params        int64                    `json:"params"`
	TrainLosses   []float64                `json:"train_losses"`     // each epoch's training loss: the mean of its -log-every steps
	TrainLoss     float64                  `json:"final_train_loss"` // the last epoch's
	HeldOutLoss   float64                  `json:"held_out_loss"`
	HeldOutBits   float64                  `json:"held_out_bits"`
	HeldOutChars  int                      `json:"held_out_characters"` // the characters the held-out loss scores
	BigramEntropy float64                  `json:"bigram_entropy"`      // H(next | previous) of the training text
	BigramEntBits float64                  `json:"bigram_entropy_bits"`
	BigramHeldOut float64                  `json:"bigram_held_out"` // the smoothed bigram model's held-out loss
	TokensPerSec  float64                  `json:"tokens_per_sec"`  // training characters per second, after the first step
	TrainSeconds  float64                  `json:"train_seconds"`
	ParamL2       float64                  `json:"param_l2"`      // the global norm of every variable of the model
	ParamsSHA256  string                   `json:"params_sha256"` // every variable's bits (strategy.Fingerprint)
	Sample        string                   `json:"sample,omitempty"`
	Variables     []strategy.VariableValue `json:"-"` // the model's variables after training
	chief         bool                     // this process prints
}

// fit trains a model on s as o says, scores it on the held-out text and
// samples from it, printing its progress to stdout on the chief.
func fit(ctx context.Context, s distribute.Strategy, o options, stdout io.Writer) (rep report, err error) {
	rep = report{Strategy: o.dist.Strategy, Replicas: distribute.NumReplicas(s), Steps: o.steps, GlobalBatch: o.globalBatch, SeqLen: o.seqLen}
	text, err := loadCorpus(o.corpus, int(o.trainBytes), int(o.evalBytes))
	if err != nil {
		return rep, err
	}
	d, err := batches(text, o)
	if err != nil {
		return rep, err
	}
	tr, err := compile(s, o)
	if err != nil {
		return rep, err
	}
	defer func() {
		if cerr := tr.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close the trainer: %w", cerr)
		}
	}()
	rep.chief, rep.HeldOutChars = tr.IsChief(), d.heldOutChars
	out := stdout
	if !rep.chief {
		out = io.Discard
	}
	describe(out, &rep, tr, text, o)
	if err := trainOn(ctx, tr, d.train, o, out, &rep); err != nil {
		return rep, err
	}
	if err := evaluate(ctx, tr, d.heldOut, out, &rep); err != nil {
		return rep, err
	}
	if rep.Sample, err = generate(ctx, tr, o); err != nil {
		return rep, err
	}
	if o.sample > 0 {
		fmt.Fprintf(out, "sample (temperature %g):\n%s\n", o.temperature, rep.Sample)
	}
	if rep.Variables, err = variables(ctx, tr); err != nil {
		return rep, err
	}
	rep.ParamL2, rep.ParamsSHA256 = strategy.GlobalNorm(rep.Variables), strategy.Fingerprint(rep.Variables)
	return rep, nil
}

// compile builds the model in s's scope and compiles it with the
// per-character cross-entropy of its logits and Adam.
func compile(s distribute.Strategy, o options) (*train.Trainer, error) {
	var model *nn.Model
	err := s.Scope(func(sc strategy.Scope) (err error) {
		model, err = newModel(sc, o)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("build the model: %w", err)
	}
	return train.Compile(s, model, train.SparseCategoricalCrossentropy{FromLogits: true}, newOptimizer(o))
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

// data is a run's input, in global batches of "x" and "y".
type data struct {
	train        dataset.Dataset // the training windows, shuffled every pass, repeated
	heldOut      dataset.Dataset // every held-out window once, the last batch partial
	heldOutChars int             // the held-out characters scored
}

// batches returns the windows of the text in global batches.
func batches(text corpus, o options) (data, error) {
	var d data
	ds, n, err := sequences(text.train, o.seqLen, "training text")
	if err != nil {
		return d, err
	}
	d.train = dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, n, uint64(o.seed)), -1), o.globalBatch, true)
	if ds, n, err = sequences(text.eval, o.seqLen, "held-out text"); err != nil {
		return d, err
	}
	d.heldOut, d.heldOutChars = dataset.Batched(ds, o.globalBatch, false), n*o.seqLen
	return d, nil
}

// sequences returns the windows of ids (see windows) as a dataset of "x"
// and "y", and their number; text too short for one is an error.
func sequences(ids []int32, seqLen int, what string) (dataset.Dataset, int, error) {
	x, y := windows(ids, seqLen)
	if len(x) == 0 {
		return nil, 0, fmt.Errorf("%s: %d characters, fewer than one sequence of %d", what, len(ids), seqLen+1)
	}
	ds, err := dataset.FromSlices(map[string]any{"x": x, "y": y})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", what, err)
	}
	return ds, len(x), nil
}

// describe prints the run's setting and the text's bigram statistics.
func describe(out io.Writer, rep *report, tr *train.Trainer, text corpus, o options) {
	for _, v := range tr.Model().Vars() {
		n := int64(1)
		for _, d := range v.Shape() {
			n *= d
		}
		rep.Params += n
	}
	bg := bigram(text.train, text.eval)
	rep.BigramEntropy, rep.BigramEntBits, rep.BigramHeldOut = bg.Entropy, bits(bg.Entropy), bg.HeldOut
	if o.printSummary {
		fmt.Fprintln(out, tr.Model().Summary())
	}
	fmt.Fprintf(out, "corpus %s: %d training characters (%d files), %d held-out (%d files)\n",
		text.dir, len(text.train), text.trainFiles, len(text.eval), text.evalFiles)
	fmt.Fprintf(out, "bigram entropy H(next|previous) %.4f nats (%.4f bits) per character; smoothed bigram model on held-out text %.4f nats (%.4f bits); unigram %.4f nats\n",
		bg.Entropy, bits(bg.Entropy), bg.HeldOut, bits(bg.HeldOut), bg.Unigram)
	fmt.Fprintf(out, "model: %d blocks, width %d, %d heads, %d parameters; strategy %s, %d replicas; global batch %d × %d characters\n",
		o.layers, o.width, o.heads, rep.Params, o.dist.Strategy, rep.Replicas, o.globalBatch, o.seqLen)
}

// trainOn trains tr on ds for -steps steps, in epochs of -log-every.
func trainOn(ctx context.Context, tr *train.Trainer, ds dataset.Dataset, o options, out io.Writer, rep *report) error {
	h, err := tr.Fit(ctx, ds, train.Epochs(o.steps/o.logEvery), train.StepsPerEpoch(o.logEvery),
		train.WithCallbacks(progress(out, o, rep)))
	if err != nil {
		return err
	}
	rep.TrainLosses = h.Values["loss"]
	rep.TrainLoss = rep.TrainLosses[len(rep.TrainLosses)-1]
	return nil
}

// progress prints each epoch's training loss and the characters per
// second since the first step, which it records in rep with the training
// time.
func progress(out io.Writer, o options, rep *report) train.Callback {
	var start, first time.Time
	var firstStep int64 // the step counted at first: 1, or more where an elastic job went on
	return &train.LambdaCallback{
		Label:      "progress",
		TrainBegin: func(context.Context, *train.Run) error { start, first = time.Now(), time.Time{}; return nil },
		BatchEnd: func(_ context.Context, r *train.Run, _ int, _ train.Logs) error {
			if first.IsZero() {
				first, firstStep = time.Now(), r.Steps()
			}
			return nil
		},
		EpochEnd: func(_ context.Context, r *train.Run, _ int, logs train.Logs) error {
			step, loss := int(r.Steps()), logs["loss"]
			rep.TrainSeconds = time.Since(start).Seconds()
			rate := ""
			if int64(step) > firstStep && !first.IsZero() {
				rep.TokensPerSec = float64((int64(step)-firstStep)*int64(o.globalBatch*o.seqLen)) / time.Since(first).Seconds()
				rate = fmt.Sprintf("  %.0f characters/s", rep.TokensPerSec)
			}
			fmt.Fprintf(out, "step %4d/%d  loss %.4f nats (%.4f bits) per character%s\n", step, o.steps, loss, bits(loss), rate)
			return nil
		},
	}
}

// evaluate scores every character of the held-out text once.
func evaluate(ctx context.Context, tr *train.Trainer, heldOut dataset.Dataset, out io.Writer, rep *report) error {
	logs, err := tr.Evaluate(ctx, heldOut, 0)
	if err != nil {
		return err
	}
	rep.HeldOutLoss = logs["loss"]
	rep.HeldOutBits = bits(rep.HeldOutLoss)
	verdict := "below"
	if rep.HeldOutLoss >= rep.BigramEntropy {
		verdict = "NOT below"
	}
	fmt.Fprintf(out, "held-out loss %.4f nats (%.4f bits) per character over %d characters: %s the bigram entropy %.4f nats (%.4f bits)\n",
		rep.HeldOutLoss, rep.HeldOutBits, rep.HeldOutChars, verdict, rep.BigramEntropy, rep.BigramEntBits)
	return nil
}

// variables reads every variable of tr's model.
func variables(ctx context.Context, tr *train.Trainer) ([]strategy.VariableValue, error) {
	s, ok := tr.Strategy().(strategy.ValueReader)
	if !ok {
		return nil, fmt.Errorf("read the variables: strategy %T cannot read them", tr.Strategy())
	}
	vals, err := strategy.ReadVariables(ctx, s, tr.Model().Variables())
	if err != nil {
		return nil, fmt.Errorf("read the variables: %w", err)
	}
	return vals, nil
}
