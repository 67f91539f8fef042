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
// item when their tastes agree (a positive dot product). The model scores a
// pair by the dot product of its embeddings and learns from logistic loss;
// it is judged on pairs it never saw. The last -cold-users users never
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

// uniform initialises an embedding table with small values from a seeded
// stateless generator.
func uniform(seed int64) strategy.Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		u := op.StatelessRandomUniform(s.SubScope("uniform"), op.Const(s.SubScope("shape"), shape),
			op.Const(s.SubScope("seed"), []int64{seed, 7}), op.StatelessRandomUniformDtype(dtype))
		return op.Mul(s.SubScope("scale"), op.Sub(s.SubScope("center"), u, op.Const(s.SubScope("half"), float32(0.5))),
			op.Const(s.SubScope("width"), float32(1))), s.Err()
	}
}

// run trains and evaluates on the cluster r names (TF_CONFIG when nil).
func run(ctx context.Context, o Options, r cluster.Resolver, log io.Writer) (Result, error) {
	res := Result{Steps: o.Steps}
	s, err := paramserver.New(ctx, r)
	if err != nil {
		return res, err
	}
	defer s.Close()
	res.Workers, res.PS = s.NumWorkers(), s.NumPS()
	part := paramserver.FixedShards(o.Shards)
	if o.Shards == 0 {
		part = paramserver.MaxShardBytes(o.MaxShardBytes, 0)
	}
	var users, items strategy.Variable
	if err := s.Scope(func(sc strategy.Scope) error {
		if users, err = sc.Variable("user_embedding", tf.Float, []int64{int64(o.Users), int64(o.Dim)}, uniform(int64(o.Seed)),
			strategy.WithPartitioner(part)); err != nil {
			return err
		}
		items, err = sc.Variable("item_embedding", tf.Float, []int64{int64(o.Items), int64(o.Dim)}, uniform(int64(o.Seed)+1),
			strategy.WithPartitioner(part))
		return err
	}); err != nil {
		return res, err
	}
	// The strategy's own variables say how they are sharded.
	res.UserShards, res.ItemShards = users.(*paramserver.Variable).NumShards(), items.(*paramserver.Variable).NumShards()
	for _, sv := range []strategy.Variable{users, items} {
		v := sv.(*paramserver.Variable)
		fmt.Fprintf(log, "%s %v in %d shard(s):", v.Name(), v.Shape(), v.NumShards())
		for _, sh := range v.Shards() {
			fmt.Fprintf(log, " rows %d..%d on %s;", sh.Offset, sh.Offset+sh.Rows-1, sh.Device)
		}
		fmt.Fprintln(log)
	}
	before, err := s.Value(ctx, users)
	if err != nil {
		return res, err
	}

	spec := strategy.InputSpec{
		"user": {DType: tf.Int32, Shape: []int64{-1}}, "item": {DType: tf.Int32, Shape: []int64{-1}},
		"click": {DType: tf.Float, Shape: []int64{-1}},
	}
	// logits scores each pair by the dot product of its embeddings.
	logits := func(rc strategy.Replica, in strategy.Inputs) (tf.Output, error) {
		u, err := rc.Lookup(users, in["user"])
		if err != nil {
			return tf.Output{}, err
		}
		i, err := rc.Lookup(items, in["item"])
		if err != nil {
			return tf.Output{}, err
		}
		sc := rc.Scope().SubScope("score")
		return op.Sum(sc.SubScope("dot"), op.Mul(sc.SubScope("mul"), u, i), op.Const(sc.SubScope("axis"), int32(1))), sc.Err()
	}
	// Logistic loss, log(1 + e^z) - y z, with log(1 + e^z) computed
	// stably as max(z, 0) + log1p(e^-|z|), from ops whose gradients
	// TensorFlow's C++ registry has.
	logLoss := func(s *op.Scope, z, y tf.Output) tf.Output {
		softplus := op.Add(s.SubScope("softplus"), op.Relu(s.SubScope("relu"), z),
			op.Log1p(s.SubScope("log1p"), op.Exp(s.SubScope("exp"), op.Neg(s.SubScope("neg"), op.Abs(s.SubScope("abs"), z)))))
		return op.Sub(s.SubScope("loss"), softplus, op.Mul(s.SubScope("yz"), y, z))
	}
	train, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		z, err := logits(rc, in)
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(logLoss(rc.Scope(), z, in["click"]))
		return strategy.Outputs{"loss": loss}, rc.Minimize(nil, loss, []strategy.Variable{users, items},
			strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: float32(o.LR)}))
	})
	if err != nil {
		return res, err
	}
	eval, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		z, err := logits(rc, in)
		if err != nil {
			return nil, err
		}
		sc := rc.Scope().SubScope("eval")
		pred := op.Cast(sc.SubScope("pred"), op.Greater(sc.SubScope("positive"), z, op.Const(sc.SubScope("zero"), float32(0))), tf.Float)
		right := op.Cast(sc.SubScope("right"), op.Equal(sc.SubScope("eq"), pred, in["click"]), tf.Float)
		axis := op.Const(sc.SubScope("axis"), int32(0))
		return strategy.Outputs{"correct": op.Sum(sc.SubScope("correct"), right, axis),
			"loss": op.Sum(sc.SubScope("loss_sum"), logLoss(sc, z, in["click"]), axis)}, nil
	})
	if err != nil {
		return res, err
	}
	c, err := paramserver.NewCoordinator(s)
	if err != nil {
		return res, err
	}
	defer c.Done(context.Background())

	w := newWorld(o)
	heldOut := make([]dataset.Element, 8)
	for k := range heldOut {
		u, i, y := w.pairs(o.Batch)
		heldOut[k] = dataset.Element{"user": mustTensor(u), "item": mustTensor(i), "click": mustTensor(y)}
	}
	evaluate := func() (acc, loss float64, err error) {
		var rvs []*paramserver.RemoteValue
		for _, e := range heldOut {
			rv, err := c.Schedule(eval, paramserver.Feed(e))
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
			acc += float64(out["correct"].Value().(float32))
			loss += float64(out["loss"].Value().(float32))
		}
		n := float64(len(heldOut) * o.Batch)
		return acc / n, loss / n, nil
	}
	if _, res.InitialLoss, err = evaluate(); err != nil {
		return res, err
	}
	// Each worker draws its own stream of pairs.
	input, err := c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
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
		return res, err
	}
	start := time.Now()
	for step := 0; step < o.Steps; {
		n := o.Steps - step
		if o.LogEvery > 0 {
			n = min(n, o.LogEvery)
		}
		for range n {
			if _, err := c.Schedule(train, input); err != nil {
				return res, err
			}
		}
		if err := c.Join(ctx); err != nil {
			return res, err
		}
		step += n
		if o.LogEvery > 0 {
			acc, loss, err := evaluate()
			if err != nil {
				return res, err
			}
			fmt.Fprintf(log, "step %4d/%d  held-out loss %.4f  accuracy %.1f%%\n", step, o.Steps, loss, 100*acc)
		}
	}
	res.ExamplesPerSec = float64(o.Steps*o.Batch) / time.Since(start).Seconds()
	if res.Accuracy, res.FinalLoss, err = evaluate(); err != nil {
		return res, err
	}
	if res.AppliedSteps, err = s.AppliedSteps(ctx); err != nil {
		return res, err
	}
	after, err := s.Value(ctx, users)
	if err != nil {
		return res, err
	}
	b, a := before.Value().([][]float32), after.Value().([][]float32)
	res.ColdRowsIntact = true
	for r := o.Users - o.ColdUsers; r < o.Users; r++ {
		for j := range b[r] {
			res.ColdRowsIntact = res.ColdRowsIntact && a[r][j] == b[r][j]
		}
	}
	return res, nil
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
