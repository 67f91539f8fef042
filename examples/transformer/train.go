package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/multiworker"
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
	Epochs        []epoch                  `json:"epochs,omitempty"`                // each epoch's end, the -save-dir saves left out
	SaveSeconds   float64                  `json:"save_seconds,omitempty"`          // the time of the -save-dir saves, left out of train_seconds
	SaveBytesSent int64                    `json:"save_bytes_sent,omitempty"`       // the bytes the saves sent, left out of the epochs' bytes_sent
	Checkpoints   []scored                 `json:"checkpoints,omitempty"`           // under -evaluate-checkpoint, each checkpoint scored, by step
	StateBytes    int64                    `json:"optimizer_state_bytes,omitempty"` // the bytes this worker holds (HeldBytes) of the variables besides the model's: the optimizer's, and -accumulate's accumulators
	TrainPeakRSS  int64                    `json:"train_peak_rss_bytes,omitempty"`  // the process's peak resident memory when training ended, before evaluation (Linux's VmHWM; left out elsewhere)
	Variables     []strategy.VariableValue `json:"-"`                               // the model's variables after training
	chief         bool                     // this process prints
}

// epoch is where training stood at the end of an epoch, before its
// -save-dir save: the time and bytes of the saves before it are left out.
type epoch struct {
	Step    int     `json:"step"`
	Loss    float64 `json:"loss"`          // the epoch's training loss
	Seconds float64 `json:"train_seconds"` // since training began
	// BytesSent is the payload bytes this worker's collectives sent since
	// training began, under multiworker on tfdist's engine (0 and left
	// out otherwise): the all-reduces of the steps, or of the
	// synchronisations under -local-sgd and -diloco.
	BytesSent int64 `json:"bytes_sent,omitempty"`
}

// scored is a checkpoint's held-out loss.
type scored struct {
	Checkpoint  string  `json:"checkpoint"`
	Step        int64   `json:"step"` // the steps trained when it was saved
	HeldOutLoss float64 `json:"held_out_loss"`
}

// fit trains a model on s as o says, scores it on the held-out text and
// samples from it, printing its progress to stdout on the chief. Under
// -evaluate-checkpoint it trains nothing: it scores the checkpoints'
// weights and samples from the last one's.
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
	if o.evaluate != "" {
		err = scoreCheckpoints(ctx, tr, d.heldOut, o.evaluate, out, &rep)
	} else if err = trainOn(ctx, tr, d.train, o, out, &rep); err == nil {
		rep.TrainPeakRSS = peakRSS()
		err = evaluate(ctx, tr, d.heldOut, out, &rep)
	}
	if err != nil {
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
	rep.StateBytes, err = stateBytes(tr)
	return rep, err
}

// stateBytes returns the bytes this worker holds of the strategy's
// variables that are not the model's (the optimizer's), when the strategy
// counts them (HeldBytes); 0 otherwise.
func stateBytes(tr *train.Trainer) (int64, error) {
	held, ok := tr.Strategy().(interface {
		HeldBytes(strategy.Variable) (int64, error)
	})
	if !ok {
		return 0, nil
	}
	model := map[string]bool{}
	for _, v := range tr.Model().Variables() {
		model[v.Name()] = true
	}
	var total int64
	for _, v := range tr.Strategy().Variables() {
		if model[v.Name()] {
			continue
		}
		n, err := held.HeldBytes(v)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// peakRSS returns the process's peak resident memory so far, Linux's
// VmHWM; 0 where there is none.
func peakRSS() int64 { return procStatus("VmHWM") }

// procStatus returns the bytes of field (VmHWM, VmRSS) of the process's
// /proc/self/status; 0 where there is none.
func procStatus(field string) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v) // "1234 kB"
			if len(f) != 2 || f[1] != "kB" {
				return 0
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
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
	opt, err := newOptimizer(o)
	if err != nil {
		return nil, fmt.Errorf("-optimizer %s: %w", o.optimizer, err)
	}
	var opts []train.Option
	if o.accumulate > 1 {
		opts = append(opts, train.WithMinimizeOptions(strategy.WithAccumulation(o.accumulate)))
	}
	return train.Compile(s, model, train.SparseCategoricalCrossentropy{FromLogits: true}, opt, opts...)
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

// optimizers are -optimizer's values.
var optimizers = []string{"adam", "adamw", "lamb", "sgd"}

// newOptimizer is -optimizer (Adam by default) on a learning rate that
// warms up linearly over -warmup steps, then decays along a cosine to a
// tenth by the last step, or by -decay-steps where it stays.
func newOptimizer(o options) (strategy.Optimizer, error) {
	last := o.steps
	if o.decaySteps > 0 {
		last = o.decaySteps
	}
	decay := optimizer.CosineDecay{Initial: float32(o.lr), DecaySteps: int64(max(last-o.warmup, 1)), Alpha: 0.1}
	lr := optimizer.Warmup{Steps: int64(o.warmup), Initial: 0, Then: decay}
	switch o.optimizer {
	case "adamw":
		return optimizer.NewAdamW(lr, optimizer.WithWeightDecay(0.01))
	case "lamb":
		return optimizer.NewLAMB(lr, optimizer.WithWeightDecay(0.01))
	case "sgd":
		return optimizer.NewSGD(lr), nil
	}
	return optimizer.NewAdam(lr), nil
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

// trainOn trains tr on ds for -steps steps, in epochs of -log-every,
// saving the weights after each under -save-dir.
func trainOn(ctx context.Context, tr *train.Trainer, ds dataset.Dataset, o options, out io.Writer, rep *report) error {
	m := &meter{}
	cbs := []train.Callback{progress(out, o, rep, m)}
	if o.saveDir != "" {
		cbs = append(cbs, m.leaveOut(&train.ModelCheckpoint{Dir: o.saveDir, SaveWeightsOnly: true})...)
	}
	h, err := tr.Fit(ctx, ds, train.Epochs(o.steps/o.logEvery), train.StepsPerEpoch(o.logEvery), train.WithCallbacks(cbs...))
	if err != nil {
		return err
	}
	rep.TrainLosses = h.Values["loss"]
	rep.TrainLoss = rep.TrainLosses[len(rep.TrainLosses)-1]
	rep.SaveSeconds, rep.SaveBytesSent = m.saving.Seconds(), m.savingBytes
	return nil
}

// progress prints each epoch's training loss and the characters per
// second since the first step, which it records in rep with the training
// time and, for each epoch, the training time and bytes sent so far, as
// m measures them (the saves left out).
func progress(out io.Writer, o options, rep *report, m *meter) train.Callback {
	var first time.Duration // when the first step ended, the saves left out
	var firstStep int64     // the step counted at first: 1, or more where an elastic job went on
	return &train.LambdaCallback{
		Label: "progress",
		TrainBegin: func(_ context.Context, r *train.Run) error {
			m.begin(r.Trainer().Strategy())
			first, firstStep = -1, 0
			return nil
		},
		BatchEnd: func(_ context.Context, r *train.Run, _ int, _ train.Logs) error {
			if first < 0 {
				first, firstStep = m.elapsed(), r.Steps()
			}
			return nil
		},
		EpochEnd: func(_ context.Context, r *train.Run, _ int, logs train.Logs) error {
			step, loss, elapsed := int(r.Steps()), logs["loss"], m.elapsed()
			rep.TrainSeconds = elapsed.Seconds()
			rep.Epochs = append(rep.Epochs, epoch{Step: step, Loss: loss, Seconds: rep.TrainSeconds, BytesSent: m.bytes()})
			rate := ""
			if int64(step) > firstStep && first >= 0 {
				rep.TokensPerSec = float64((int64(step)-firstStep)*int64(o.globalBatch*o.seqLen)) / (elapsed - first).Seconds()
				rate = fmt.Sprintf("  %.0f characters/s", rep.TokensPerSec)
			}
			fmt.Fprintf(out, "step %4d/%d  loss %.4f nats (%.4f bits) per character%s\n", step, o.steps, loss, bits(loss), rate)
			return nil
		},
	}
}

// meter measures training by the wall clock and by the bytes this
// worker's collectives send, leaving out what the callbacks it wraps
// (leaveOut) take: the checkpoint saves, which would otherwise count as
// training.
type meter struct {
	sent        func() int64 // the bytes sent so far
	start       time.Time
	startBytes  int64
	saving      time.Duration // the wrapped callbacks' time so far
	savingBytes int64         // and their bytes
	mark        time.Time     // when the callback running began
	markBytes   int64
}

// begin starts the measurement of training under s: the bytes come from
// the collectives of a *multiworker.Strategy (CollectiveStats), and are 0
// under any other strategy.
func (m *meter) begin(s train.Strategy) {
	m.sent = func() int64 { return 0 }
	if mw, ok := s.(*multiworker.Strategy); ok {
		m.sent = func() int64 { return mw.CollectiveStats().BytesSent }
	}
	m.start, m.startBytes, m.saving, m.savingBytes = time.Now(), m.sent(), 0, 0
}

// elapsed is the training time since begin, the wrapped callbacks' left
// out.
func (m *meter) elapsed() time.Duration { return time.Since(m.start) - m.saving }

// bytes is the bytes sent since begin, the wrapped callbacks' left out.
func (m *meter) bytes() int64 { return m.sent() - m.startBytes - m.savingBytes }

// leaveOut returns c between two callbacks that take the time and bytes
// of its epoch ends out of m's measurement: Fit calls callbacks in order.
func (m *meter) leaveOut(c train.Callback) []train.Callback {
	before := &train.LambdaCallback{Label: "before the save", EpochEnd: func(context.Context, *train.Run, int, train.Logs) error {
		m.mark, m.markBytes = time.Now(), m.sent()
		return nil
	}}
	after := &train.LambdaCallback{Label: "after the save", EpochEnd: func(context.Context, *train.Run, int, train.Logs) error {
		m.saving += time.Since(m.mark)
		m.savingBytes += m.sent() - m.markBytes
		return nil
	}}
	return []train.Callback{before, c, after}
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

// scoreCheckpoints restores into tr's model the weights of the checkpoint
// at path, or of each checkpoint in directory path in the order of their
// steps, and scores the held-out text with each; rep ends with the last
// one's held-out loss and step.
func scoreCheckpoints(ctx context.Context, tr *train.Trainer, heldOut dataset.Dataset, path string, out io.Writer, rep *report) error {
	prefixes, err := checkpointsAt(path)
	if err != nil {
		return fmt.Errorf("-evaluate-checkpoint %s: %w", path, err)
	}
	src, ok := tr.Strategy().(checkpoint.Source)
	if !ok {
		return fmt.Errorf("-evaluate-checkpoint %s: strategy %T cannot restore a checkpoint", path, tr.Strategy())
	}
	// The strategy's variables besides the model's (the optimizer's) are
	// not in a checkpoint of weights; holdsModel checks the model's are.
	saver, err := checkpoint.NewSaver(src, checkpoint.WithAllowPartial(true))
	if err != nil {
		return fmt.Errorf("-evaluate-checkpoint %s: %w", path, err)
	}
	for _, p := range prefixes {
		if err := holdsModel(p, tr.Model().Variables()); err != nil {
			return fmt.Errorf("-evaluate-checkpoint %s: %w", path, err)
		}
		md, err := saver.Restore(ctx, p)
		if err != nil {
			return fmt.Errorf("-evaluate-checkpoint %s: %w", path, err)
		}
		step, _ := md.Int64(checkpoint.GlobalStepKey)
		fmt.Fprintf(out, "checkpoint %s, step %d: ", p, step)
		if err := evaluate(ctx, tr, heldOut, out, rep); err != nil {
			return err
		}
		rep.Steps = int(step)
		rep.Checkpoints = append(rep.Checkpoints, scored{Checkpoint: p, Step: step, HeldOutLoss: rep.HeldOutLoss})
	}
	return nil
}

// checkpointsAt returns the checkpoint at path (its prefix), or every
// checkpoint in directory path, ordered by the number that ends each
// prefix, the step of ModelCheckpoint's ckpt-STEP.
func checkpointsAt(path string) ([]string, error) {
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		indexes, err := filepath.Glob(filepath.Join(path, "*.index"))
		if err != nil {
			return nil, err
		}
		if len(indexes) == 0 {
			return nil, errors.New("a directory without checkpoints (no .index file)")
		}
		prefixes := make([]string, len(indexes))
		for i, f := range indexes {
			prefixes[i] = strings.TrimSuffix(f, ".index")
		}
		slices.SortFunc(prefixes, func(a, b string) int { return cmp.Or(cmp.Compare(endNumber(a), endNumber(b)), strings.Compare(a, b)) })
		return prefixes, nil
	}
	if _, err := os.Stat(checkpoint.IndexFile(path)); err != nil {
		return nil, fmt.Errorf("neither a checkpoint nor a directory of checkpoints: %w", err)
	}
	return []string{path}, nil
}

// endNumber is the number after the last '-' of prefix, or -1.
func endNumber(prefix string) int64 {
	n, err := strconv.ParseInt(prefix[strings.LastIndexByte(prefix, '-')+1:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// holdsModel checks that the checkpoint at prefix has a value for each of
// the model's variables vars.
func holdsModel(prefix string, vars []strategy.Variable) error {
	entries, err := checkpoint.List(prefix)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name] = true
	}
	var missing []string
	for _, v := range vars {
		if !have[v.Name()] {
			missing = append(missing, v.Name())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("checkpoint %s has no value for %d of the model's %d variables, %q the first: a checkpoint of another model?",
			prefix, len(missing), len(vars), missing[0])
	}
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
