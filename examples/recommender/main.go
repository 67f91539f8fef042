// Command recommender trains a tiny recommender with the parameter-server
// strategy: a user embedding table and an item embedding table, each sharded
// over the ps tasks, updated sparsely — a step changes only the rows of the
// users and items in its batch, on the ps task that holds them — from
// synthetic clicks.
//
//	tfdist launch --chief --workers 2 --ps 2 -- recommender
//	tfdist launch --chief --workers 2 --ps 2 -- recommender -users 100000 -max-shard-bytes 1048576
//
// The data: every user and item has a hidden taste vector; a user clicks an
// item when their tastes agree (a positive dot product). The model, two
// nn.Embedding layers whose tables the strategy's partitioner shards,
// scores a pair by the dot product of its embeddings and learns from
// logistic loss (nn.SigmoidCrossEntropy) with optimizer.SparseSGD; it is
// judged on pairs it never saw. The last -cold-users users never
// appear in training: their embeddings must come out exactly as they went
// in, since no sparse update ever touched their rows.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// Options are the command's flags.
type Options struct {
	Users, Items, Dim, Taste int
	ColdUsers                int
	Shards                   int
	MaxShardBytes            int64
	Steps, Batch             int
	LR                       float64
	Seed                     uint64
	LogEvery                 int
	JSON                     bool
}

// Result is what the command reports (the -json line).
type Result struct {
	Workers        int     `json:"workers"`
	PS             int     `json:"ps"`
	UserShards     int     `json:"user_shards"`
	ItemShards     int     `json:"item_shards"`
	Steps          int     `json:"steps"`
	AppliedSteps   int64   `json:"applied_steps"`
	InitialLoss    float64 `json:"initial_loss"`
	FinalLoss      float64 `json:"final_loss"`
	Accuracy       float64 `json:"accuracy"`
	ColdRowsIntact bool    `json:"cold_rows_intact"`
	ExamplesPerSec float64 `json:"examples_per_sec"`
}

func parseFlags(args []string, stderr io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("recommender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Users, "users", 1000, "users (rows of the user table)")
	fs.IntVar(&o.Items, "items", 200, "items (rows of the item table)")
	fs.IntVar(&o.Dim, "dim", 16, "embedding size")
	fs.IntVar(&o.Taste, "taste", 4, "size of the hidden taste vectors the clicks come from")
	fs.IntVar(&o.ColdUsers, "cold-users", 50, "users left out of training, whose rows must not change")
	fs.IntVar(&o.Shards, "shards", 2, "shards of each table (0: -max-shard-bytes decides)")
	fs.Int64Var(&o.MaxShardBytes, "max-shard-bytes", 0, "with -shards 0: the largest shard, in bytes")
	fs.IntVar(&o.Steps, "steps", 500, "training steps")
	fs.IntVar(&o.Batch, "batch", 128, "pairs per step")
	fs.Float64Var(&o.LR, "lr", 30, "learning rate of the sparse updates (of the batch-mean loss)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the data and the initial embeddings")
	fs.IntVar(&o.LogEvery, "log-every", 100, "print progress every N steps (0: never)")
	fs.BoolVar(&o.JSON, "json", false, "end with one JSON line of results on stdout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.Users < 2 || o.Items < 2 || o.Dim < 1 || o.Taste < 1:
		return o, fmt.Errorf("-users %d -items %d -dim %d -taste %d: expected at least 2 users and items and sizes of at least 1",
			o.Users, o.Items, o.Dim, o.Taste)
	case o.ColdUsers < 0 || o.ColdUsers >= o.Users:
		return o, fmt.Errorf("-cold-users %d: expected 0..%d", o.ColdUsers, o.Users-1)
	case o.Shards < 0 || o.Shards == 0 && o.MaxShardBytes <= 0:
		return o, fmt.Errorf("-shards %d -max-shard-bytes %d: expected a number of shards, or 0 and a positive byte limit", o.Shards, o.MaxShardBytes)
	case o.Steps < 1 || o.Batch < 1:
		return o, fmt.Errorf("-steps %d -batch %d: expected at least 1 of each", o.Steps, o.Batch)
	}
	return o, nil
}

// world is the synthetic data's hidden truth.
type world struct {
	users, items [][]float64
	rng          *rand.Rand
	o            Options
}

func newWorld(o Options) *world {
	rng := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	taste := func(n int) [][]float64 {
		out := make([][]float64, n)
		for i := range out {
			out[i] = make([]float64, o.Taste)
			for j := range out[i] {
				out[i][j] = rng.NormFloat64()
			}
		}
		return out
	}
	return &world{users: taste(o.Users), items: taste(o.Items), rng: rng, o: o}
}

// pairs draws n (user, item, click) examples among the warm users.
func (w *world) pairs(n int) (users, items []int32, clicks []float32) {
	warm := w.o.Users - w.o.ColdUsers
	for range n {
		u, i := w.rng.IntN(warm), w.rng.IntN(w.o.Items)
		var dot float64
		for j := range w.users[u] {
			dot += w.users[u][j] * w.items[i][j]
		}
		c := float32(0)
		if dot > 0 {
			c = 1
		}
		users, items, clicks = append(users, int32(u)), append(items, int32(i)), append(clicks, c)
	}
	return users, items, clicks
}

// model scores a (user, item) pair by the dot product of their
// embeddings: two nn.Embedding tables, sharded over the ps tasks.
type model struct {
	users, items nn.Layer
}

// newModel creates the tables in s, seeded by seed.
func newModel(s *paramserver.Strategy, o Options) (*model, error) {
	var m model
	err := s.Scope(func(sc strategy.Scope) error {
		var err error
		if m.users, _, err = (nn.Embedding{InputDim: o.Users, OutputDim: o.Dim}).Build(sc, "user_embedding", nil, int64(o.Seed)); err != nil {
			return err
		}
		m.items, _, err = (nn.Embedding{InputDim: o.Items, OutputDim: o.Dim}).Build(sc, "item_embedding", nil, int64(o.Seed)+1)
		return err
	})
	return &m, err
}

// vars returns the user table and the item table.
func (m *model) vars() []strategy.Variable { return append(m.users.Vars(), m.items.Vars()...) }

// logits scores each pair of the batch.
func (m *model) logits(rc strategy.Replica, b *nn.Builder, in strategy.Inputs) (tf.Output, error) {
	u, err := m.users.Apply(rc, in["user"], true)
	if err != nil {
		return tf.Output{}, err
	}
	i, err := m.items.Apply(rc, in["item"], true)
	if err != nil {
		return tf.Output{}, err
	}
	return b.Sum(b.Mul(u, i), false, 1), nil
}

// trainStep minimises the logistic loss, updating only the rows the batch
// looked up, with SparseSGD.
func (m *model) trainStep(lr float64) strategy.ReplicaFn {
	return func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		b := nn.NewBuilder(rc.Scope(), "train")
		z, err := m.logits(rc, b, in)
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(nn.SigmoidCrossEntropy(b.Op(), z, in["click"]))
		return strategy.Outputs{"loss": loss}, rc.Minimize(nil, loss, m.vars(),
			strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: float32(lr)}))
	}
}

// evalStep outputs the batch's summed logistic loss and how many clicks it
// predicts right (a click where the score is positive).
func (m *model) evalStep(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
	b := nn.NewBuilder(rc.Scope(), "eval")
	z, err := m.logits(rc, b, in)
	if err != nil {
		return nil, err
	}
	pred := b.Cast(op.Greater(b.Op(), z, b.Scalar(0, tf.Float)), tf.Float)
	right := b.Cast(op.Equal(b.Op(), pred, in["click"]), tf.Float)
	return strategy.Outputs{"correct": b.SumAll(right), "loss": b.SumAll(nn.SigmoidCrossEntropy(b.Op(), z, in["click"]))}, nil
}

// spec is the input of both steps: pairs of ids and whether the user
// clicked.
var spec = strategy.InputSpec{
	"user": {DType: tf.Int32, Shape: []int64{-1}}, "item": {DType: tf.Int32, Shape: []int64{-1}},
	"click": {DType: tf.Float, Shape: []int64{-1}},
}

// sharded is what the parameter-server strategy's variables tell of their
// shards, asked without their concrete type.
type sharded interface {
	NumShards() int
	Shards() []paramserver.ShardInfo
}

// numShards returns the number of shards of v: 1 for a variable the
// strategy keeps in one piece.
func numShards(v strategy.Variable) int {
	if sv, ok := v.(sharded); ok {
		return sv.NumShards()
	}
	return 1
}

// describeShards writes where the shards of each of vars live.
func describeShards(log io.Writer, vars []strategy.Variable) {
	for _, v := range vars {
		fmt.Fprintf(log, "%s %v in %d shard(s):", v.Name(), v.Shape(), numShards(v))
		if sv, ok := v.(sharded); ok {
			for _, sh := range sv.Shards() {
				fmt.Fprintf(log, " rows %d..%d on %s;", sh.Offset, sh.Offset+sh.Rows-1, sh.Device)
			}
		}
		fmt.Fprintln(log)
	}
}

// run trains and evaluates on the cluster r names (TF_CONFIG when nil).
func run(ctx context.Context, o Options, r cluster.Resolver, log io.Writer) (Result, error) {
	res := Result{Steps: o.Steps}
	part := paramserver.FixedShards(o.Shards)
	if o.Shards == 0 {
		part = paramserver.MaxShardBytes(o.MaxShardBytes, 0)
	}
	s, err := paramserver.New(ctx, r, paramserver.WithPartitioner(part))
	if err != nil {
		return res, err
	}
	defer s.Close()
	res.Workers, res.PS = s.NumWorkers(), s.NumPS()
	m, err := newModel(s, o)
	if err != nil {
		return res, err
	}
	users, items := m.users.Vars()[0], m.items.Vars()[0]
	res.UserShards, res.ItemShards = numShards(users), numShards(items)
	describeShards(log, m.vars())
	before, err := s.Value(ctx, users)
	if err != nil {
		return res, err
	}
	t, err := newTrainer(ctx, s, m, o)
	if err != nil {
		return res, err
	}
	defer t.c.Done(context.Background())
	if err := t.train(ctx, &res, log); err != nil {
		return res, err
	}
	if res.AppliedSteps, err = s.AppliedSteps(ctx); err != nil {
		return res, err
	}
	after, err := s.Value(ctx, users)
	if err != nil {
		return res, err
	}
	res.ColdRowsIntact = coldRowsIntact(before, after, o)
	return res, nil
}

// coldRowsIntact reports whether the rows of the users left out of
// training are the same in both values of the user table.
func coldRowsIntact(before, after *tf.Tensor, o Options) bool {
	b, a := strategy.TensorValue(before).([][]float32), strategy.TensorValue(after).([][]float32)
	for r := o.Users - o.ColdUsers; r < o.Users; r++ {
		for j := range b[r] {
			if a[r][j] != b[r][j] {
				return false
			}
		}
	}
	return true
}

// trainer schedules the model's steps through the coordinator.
type trainer struct {
	o       Options
	c       *paramserver.Coordinator
	trainFn *paramserver.Function
	evalFn  *paramserver.Function
	heldOut []dataset.Element // pairs no step trains on
	input   *paramserver.PerWorkerDataset
}

// newTrainer builds the steps, draws the held-out pairs and starts each
// worker's stream of training pairs.
func newTrainer(ctx context.Context, s *paramserver.Strategy, m *model, o Options) (*trainer, error) {
	t := &trainer{o: o}
	var err error
	if t.trainFn, err = s.Build(spec, m.trainStep(o.LR)); err != nil {
		return nil, err
	}
	if t.evalFn, err = s.Build(spec, m.evalStep); err != nil {
		return nil, err
	}
	if t.c, err = paramserver.NewCoordinator(s); err != nil {
		return nil, err
	}
	w := newWorld(o)
	t.heldOut = make([]dataset.Element, 8)
	for k := range t.heldOut {
		u, i, y := w.pairs(o.Batch)
		t.heldOut[k] = dataset.Element{"user": mustTensor(u), "item": mustTensor(i), "click": mustTensor(y)}
	}
	// Each worker draws its own stream of pairs.
	t.input, err = t.c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		ww := newWorld(o)
		ww.rng = rand.New(rand.NewPCG(o.Seed, uint64(1000+ictx.InputPipelineID)))
		u, i, y := ww.pairs(o.Batch * o.Steps / ictx.NumInputPipelines)
		ds, err := dataset.FromSlices(map[string]any{"user": u, "item": i, "click": y})
		if err != nil {
			return nil, err
		}
		return dataset.Batched(dataset.Repeat(ds, -1), o.Batch, true), nil
	})
	if err != nil {
		t.c.Done(context.Background())
		return nil, err
	}
	return t, nil
}

// train runs -steps steps, scheduled in chunks of -log-every and joined
// after each chunk to report the held-out loss and accuracy, and fills in
// res's losses, accuracy and rate.
func (t *trainer) train(ctx context.Context, res *Result, log io.Writer) error {
	var err error
	if _, res.InitialLoss, err = t.evaluate(ctx); err != nil {
		return err
	}
	start := time.Now()
	for step := 0; step < t.o.Steps; {
		n := t.o.Steps - step
		if t.o.LogEvery > 0 {
			n = min(n, t.o.LogEvery)
		}
		for range n {
			if _, err := t.c.Schedule(t.trainFn, t.input); err != nil {
				return err
			}
		}
		if err := t.c.Join(ctx); err != nil {
			return err
		}
		step += n
		if t.o.LogEvery > 0 {
			acc, loss, err := t.evaluate(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(log, "step %4d/%d  held-out loss %.4f  accuracy %.1f%%\n", step, t.o.Steps, loss, 100*acc)
		}
	}
	res.ExamplesPerSec = float64(t.o.Steps*t.o.Batch) / time.Since(start).Seconds()
	res.Accuracy, res.FinalLoss, err = t.evaluate(ctx)
	return err
}

// evaluate returns the accuracy and the mean logistic loss on the
// held-out pairs, scored on the workers.
func (t *trainer) evaluate(ctx context.Context) (acc, loss float64, err error) {
	var rvs []*paramserver.RemoteValue
	for _, e := range t.heldOut {
		rv, err := t.c.Schedule(t.evalFn, paramserver.Feed(e))
		if err != nil {
			return 0, 0, err
		}
		rvs = append(rvs, rv)
	}
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		if err != nil {
			return 0, 0, err
		}
		acc += float64(strategy.TensorValue(out["correct"]).(float32))
		loss += float64(strategy.TensorValue(out["loss"]).(float32))
	}
	n := float64(len(t.heldOut) * t.o.Batch)
	return acc / n, loss / n, nil
}

func mustTensor(v any) *tf.Tensor {
	t, err := tf.NewTensor(v)
	if err != nil {
		panic(err)
	}
	return t
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "recommender:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o, nil, os.Stdout)
	if errors.Is(err, paramserver.ErrNotChief) {
		return // a ps or worker task: it served until the chief was done
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "recommender:", err)
		os.Exit(1)
	}
	fmt.Printf("held-out accuracy %.1f%% (loss %.4f, from %.4f), %d updates applied for %d steps, cold users' rows intact: %v\n",
		100*res.Accuracy, res.FinalLoss, res.InitialLoss, res.AppliedSteps, res.Steps, res.ColdRowsIntact)
	if o.JSON {
		line, _ := json.Marshal(res)
		fmt.Println(string(line))
	}
}
