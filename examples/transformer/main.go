// Command transformer trains a decoder-only character-level Transformer
// language model on the Go standard library's source, the text every
// machine that builds tfdist has, with train.Fit under the strategy its
// flags name, and compares its held-out loss per character with the
// text's bigram entropy; at the end it samples text from the model. It
// uses the public API only: copy it into a module of your own.
//
//	transformer -strategy mirrored -devices 2
//	transformer -strategy default -steps 200 -json
//	tfdist launch --workers 2 -- transformer -strategy multiworker
//	tfdist launch --chief --workers 2 --ps 1 -- transformer -strategy ps
//	tfdist launch --elastic --min-workers 1 --max-workers 4 -- transformer -strategy elastic
//
// The text: the .go files under $(go env GOROOT)/src (-corpus names
// another directory), sorted by path; every tenth file is held out, the
// others train, each set capped (-train-bytes, -eval-bytes). Characters
// are ids of a fixed vocabulary: printable ASCII, tab, newline, and one
// id for any other byte.
//
// The model (newModel) is a GPT-style decoder: token and position
// embeddings, -layers blocks of pre-LayerNorm causal multi-head
// self-attention and a GELU MLP, each with a residual connection, a final
// LayerNorm and a Dense layer to the vocabulary's logits. It is compiled
// with Adam and Keras's sparse categorical cross-entropy of the logits
// [batch, seq-len, vocabulary] against the next characters
// [batch, seq-len]: the mean over each sequence, then over the global
// batch, which is the mean per character. Fit trains -steps steps in
// epochs of -log-every, printing each epoch's loss; Evaluate scores the
// held-out text and Predict runs the model for the sample. With the same
// seed, data order and global batch, every synchronous strategy trains
// the model one device trains, up to float summation order.
//
// In Keras (keras_hub's layers), the model is:
//
//	ids = keras.Input((seq_len,), dtype="int32")
//	x = keras_hub.layers.TokenAndPositionEmbedding(vocab, seq_len, width)(ids)
//	for _ in range(layers):
//	    h = keras.layers.LayerNormalization()(x)
//	    h = keras.layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=True)
//	    x = keras.layers.Add()([x, h])
//	    h = keras.layers.LayerNormalization()(x)
//	    h = keras.layers.Dense(4 * width, activation="gelu")(h)
//	    h = keras.layers.Dense(width)(h)
//	    x = keras.layers.Add()([x, h])
//	logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(x))
//	model = keras.Model(ids, logits)
//
// -save-dir saves the model's weights at the end of every epoch, and
// -evaluate-checkpoint scores such checkpoints instead of training, so
// that runs under strategies whose own Evaluate differ (under -local-sgd
// and -diloco a worker scores its own model) are scored alike, by one
// process on the whole held-out text:
//
//	tfdist launch --workers 4 -- transformer -strategy multiworker -diloco 50 -save-dir runs/diloco -json
//	transformer -evaluate-checkpoint runs/diloco -json
//
// The -json line then holds, for each epoch, the step, the training
// seconds and the bytes this worker's collectives sent since training
// began, without the time and bytes of the saves; or, under
// -evaluate-checkpoint, each checkpoint's step and held-out loss.
//
// Under multiworker every worker trains, scores its shard of the held-out
// text and samples in step with the others; only the chief prints. Under
// parameter servers (-strategy ps) the same program runs as every task:
// the chief's coordinator schedules the steps, each on whichever worker
// (one device each) is free, and the ps and worker tasks serve it until
// the job ends.
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
	"strconv"
	"strings"
	"syscall"

	"github.com/tfdist/tfdist/distribute"
)

// options are the command's flags.
type options struct {
	dist         distribute.Config
	corpus       string
	trainBytes   byteSize
	evalBytes    byteSize
	steps        int
	globalBatch  int
	seqLen       int
	width        int
	heads        int
	layers       int
	lr           float64
	warmup       int
	seed         int64
	logEvery     int
	sample       int
	prompt       string
	temperature  float64
	json         bool
	optimizer    string // adam, adamw, lamb or sgd
	accumulate   int    // global batches whose gradients an update accumulates (1: none)
	printSummary bool
	decaySteps   int    // 0: steps
	saveDir      string // where each epoch's weights are saved ("": nowhere)
	evaluate     string // a checkpoint, or a directory of them, to score instead of training
}

// defaults are the flags' defaults: about two minutes under
// `-strategy mirrored -devices 2` on two cores.
func defaults() options {
	return options{
		dist:       distribute.Config{Strategy: "default"},
		trainBytes: 2 << 20, evalBytes: 256 << 10,
		steps: 1500, globalBatch: 32, seqLen: 64,
		width: 64, heads: 4, layers: 2,
		lr: 3e-3, optimizer: "adam", accumulate: 1, warmup: 50, seed: 1, logEvery: 100,
		sample: 300, prompt: "func ", temperature: 0.8,
	}
}

// parseFlags parses args into options.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := defaults()
	fs := flag.NewFlagSet("transformer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.dist.RegisterFlags(fs)
	fs.StringVar(&o.corpus, "corpus", "", "directory of .go files to learn from (default $(go env GOROOT)/src)")
	fs.Var(&o.trainBytes, "train-bytes", "training text to read, in bytes (KiB, MiB suffixes)")
	fs.Var(&o.evalBytes, "eval-bytes", "held-out text to read, in bytes (KiB, MiB suffixes)")
	fs.IntVar(&o.steps, "steps", o.steps, "training steps")
	fs.IntVar(&o.globalBatch, "global-batch", o.globalBatch, "sequences per step across all replicas")
	fs.IntVar(&o.seqLen, "seq-len", o.seqLen, "characters per sequence")
	fs.IntVar(&o.width, "width", o.width, "model width (embedding size)")
	fs.IntVar(&o.heads, "heads", o.heads, "attention heads (dividing -width)")
	fs.IntVar(&o.layers, "layers", o.layers, "Transformer blocks")
	fs.Float64Var(&o.lr, "lr", o.lr, "the optimizer's learning rate")
	fs.IntVar(&o.accumulate, "accumulate", o.accumulate, "global batches whose gradients one update accumulates (strategy.WithAccumulation), each a step")
	fs.StringVar(&o.optimizer, "optimizer", o.optimizer, "the optimizer: adam, adamw (weight decay 0.01), lamb (weight decay 0.01) or sgd")
	fs.IntVar(&o.warmup, "warmup", o.warmup, "steps of linear learning-rate warmup, then cosine decay to a tenth")
	fs.IntVar(&o.decaySteps, "decay-steps", 0, "the step by which the learning rate has decayed to a tenth, where it stays (0: -steps); runs of different -steps with the same value follow one schedule")
	fs.Int64Var(&o.seed, "seed", o.seed, "seed of the initial values, the data order and the sampling")
	fs.IntVar(&o.logEvery, "log-every", o.logEvery, "steps of an epoch, after each of which the training loss is printed (dividing -steps)")
	fs.IntVar(&o.sample, "sample", o.sample, "characters to sample from the trained model (0: none)")
	fs.StringVar(&o.prompt, "prompt", o.prompt, "text the sample starts from")
	fs.Float64Var(&o.temperature, "temperature", o.temperature, "sampling temperature")
	fs.BoolVar(&o.json, "json", false, "print one JSON line of results")
	fs.BoolVar(&o.printSummary, "summary", false, "print the model's layers and parameters")
	fs.StringVar(&o.saveDir, "save-dir", "", "save the model's weights at the end of every epoch, as checkpoint `DIR`/ckpt-STEP (the chief writes)")
	fs.StringVar(&o.evaluate, "evaluate-checkpoint", "",
		"do not train: restore the weights of checkpoint `PATH` (DIR/ckpt-STEP), or of every checkpoint in directory PATH in turn, and score the held-out text")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, o.check()
}

// check reports a flag value the program cannot run with.
func (o options) check() error {
	switch {
	case o.steps < 1 || o.globalBatch < 1 || o.seqLen < 1 || o.layers < 1:
		return fmt.Errorf("-steps %d, -global-batch %d, -seq-len %d, -layers %d: expected at least 1 each", o.steps, o.globalBatch, o.seqLen, o.layers)
	case o.heads < 1 || o.width%o.heads != 0:
		return fmt.Errorf("-heads %d: expected a positive divisor of -width %d", o.heads, o.width)
	case o.trainBytes < 2 || o.evalBytes < 2:
		return fmt.Errorf("-train-bytes %d, -eval-bytes %d: expected at least 2 each", o.trainBytes, o.evalBytes)
	case o.lr <= 0 || o.temperature <= 0:
		return fmt.Errorf("-lr %g, -temperature %g: expected both positive", o.lr, o.temperature)
	case o.accumulate < 1:
		return fmt.Errorf("-accumulate %d: expected 1 (no accumulation) or more", o.accumulate)
	case o.logEvery < 1 || o.sample < 0 || o.warmup < 0:
		return fmt.Errorf("-log-every %d, -sample %d, -warmup %d: expected -log-every at least 1, the others 0 or more", o.logEvery, o.sample, o.warmup)
	case o.steps%o.logEvery != 0:
		return fmt.Errorf("-steps %d: expected a multiple of -log-every %d, the steps of an epoch", o.steps, o.logEvery)
	case o.dist.Strategy == "ps" && o.dist.Devices > 1:
		return fmt.Errorf("-strategy ps -devices %d: each worker runs its steps on one device", o.dist.Devices)
	case !slices.Contains(optimizers, o.optimizer):
		return fmt.Errorf("-optimizer %q: expected one of %s", o.optimizer, strings.Join(optimizers, ", "))
	case o.decaySteps < 0:
		return fmt.Errorf("-decay-steps %d: expected 0 (-steps) or more", o.decaySteps)
	case o.evaluate != "" && o.saveDir != "":
		return fmt.Errorf("-evaluate-checkpoint %s, -save-dir %s: expected one or the other (scoring a checkpoint trains nothing to save)", o.evaluate, o.saveDir)
	case o.evaluate != "" && o.dist.LocalSGD != nil:
		return fmt.Errorf("-evaluate-checkpoint %s with -local-sgd or -diloco: each worker would score alone; expected a synchronous strategy", o.evaluate)
	}
	return nil
}

// byteSize is a flag of bytes, with an optional KiB, MiB or GiB suffix.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

func (b *byteSize) Set(s string) error {
	unit := 1
	for suffix, u := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suffix) {
			s, unit = strings.TrimSuffix(s, suffix), u
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q: expected a number of bytes, optionally with a KiB, MiB or GiB suffix", s)
	}
	*b = byteSize(n * unit)
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Main runs the command with args and returns its exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "transformer:", err)
		return 2
	}
	if err := run(ctx, o, stdout); err != nil {
		fmt.Fprintln(stderr, "transformer:", err)
		return 1
	}
	return 0
}

// run makes the strategy the flags name and trains under it. On a ps or
// worker task of a parameter-server cluster the strategy serves the chief
// until the job ends, and run returns nil. Under elastic, SIGTERM makes
// the worker leave the job at the next step boundary; otherwise it stops
// training.
func run(ctx context.Context, o options, stdout io.Writer) error {
	if o.corpus == "" {
		dir, err := goSource()
		if err != nil {
			return err
		}
		o.corpus = dir
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leave := make(chan struct{})
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	go func() {
		select {
		case <-term:
			if o.dist.Strategy == "elastic" {
				close(leave)
			} else {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	o.dist.Leave = leave
	var rep report
	err := distribute.Run(ctx, o.dist, func(ctx context.Context, s distribute.Strategy) error {
		r, err := fit(ctx, s, o, stdout)
		if err == nil {
			rep = r
		}
		return err
	})
	if err != nil || !o.json || !rep.chief {
		return err
	}
	line, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", line)
	return err
}

// bits converts nats to bits.
func bits(nats float64) float64 { return nats / math.Ln2 }
