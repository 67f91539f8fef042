// Command elastic trains the digits classifier as an elastic job: workers
// may die, be replaced, join or leave while it trains, and every example
// of every epoch is still trained on exactly once. Run it under the
// launcher, which runs the job's rendezvous and replaces a failed worker:
//
//	tfdist launch --elastic --min-workers 2 --max-workers 4 -- go run ./examples/elastic
//
// then kill a worker, or send the launcher SIGUSR1 (one worker more) or
// SIGUSR2 (one fewer). Alone, without the launcher, it runs a rendezvous of
// its own and trains as the only worker. It uses the public API only: copy
// it into a module of your own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// options are the command's flags.
type options struct {
	steps       int64
	globalBatch int
	host        string
	seed        uint64
	shards      int // WithDeterministic's virtual shards, 0 without
}

// result is what a finished job reports.
type result struct {
	accuracy float64
	model    string // strategy.Fingerprint of the variables
}

// inputs are what the steps read: x [batch, 64] float32 pixels and y
// [batch] int32 labels.
var inputs = strategy.InputSpec{
	"x": {DType: tf.Float, Shape: []int64{-1, digits.Features}},
	"y": {DType: tf.Int32, Shape: []int64{-1}},
}

// job is what every membership's training uses.
type job struct {
	o           options
	train, test digits.Data
}

// run trains on s, a membership's strategy, from the step Resume gives,
// and returns the held-out accuracy once every step is done.
func (j *job) run(ctx context.Context, s *multiworker.Strategy) (result, error) {
	var res result
	var model *nn.Model
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		in := nn.Input(digits.Features)
		h := nn.Dense{Units: 64, Activation: nn.ReLU}.Call(in)
		model, err = nn.NewModel(sc, "mlp", []*nn.Tensor{in}, []*nn.Tensor{nn.Dense{Units: digits.Classes}.Call(h)}, nn.WithSeed(int64(j.o.seed)))
		return err
	}); err != nil {
		return res, err
	}
	opt := optimizer.NewMomentum(optimizer.Constant(0.05), 0.9, false)
	step, err := s.Build(inputs, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := model.Apply(rc, in["x"], true)
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(rc.Scope(), logits, in["y"], digits.Classes))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, model.Vars())
	})
	if err != nil {
		return res, err
	}
	start, err := s.Resume(ctx) // the state of the newest completed step
	if err != nil {
		return res, err
	}
	if s.IsChief() {
		fmt.Printf("%d workers from step %d\n", s.NumWorkers(), start)
	}
	for i := start; i < j.o.steps; i++ {
		out, err := s.RunReplicas(ctx, step, j.share(s, i), j.o.globalBatch/s.NumWorkers())
		if err != nil {
			return res, err
		}
		if (i+1)%100 == 0 {
			loss, err := s.Reduce(ctx, strategy.Sum, out["loss"])
			if err != nil {
				return res, err
			}
			if s.IsChief() {
				fmt.Printf("step %d: loss %.4f\n", i+1, strategy.TensorValue(loss).(float32))
			}
		}
		if err := s.StepDone(ctx); err != nil { // a change of members stops here
			return res, err
		}
	}
	if res.accuracy, err = j.heldOut(ctx, s, model); err != nil {
		return res, err
	}
	values, err := strategy.ReadVariables(ctx, s, model.Vars())
	res.model = strategy.Fingerprint(values)
	return res, err
}

// share is this worker's part of global batch i, split among its local
// replicas: the batches of an epoch are a permutation of the training
// examples that every worker computes alike, so that whatever the members,
// each example is trained on once an epoch.
func (j *job) share(s *multiworker.Strategy, i int64) []map[string]*tf.Tensor {
	perEpoch := int64(j.train.Len() / j.o.globalBatch)
	perm := rand.New(rand.NewPCG(j.o.seed, uint64(i/perEpoch))).Perm(j.train.Len())
	per := j.o.globalBatch / s.NumWorkers()
	lo := int(i%perEpoch)*j.o.globalBatch + s.WorkerID()*per
	reps := s.NumLocalReplicas()
	feeds := make([]map[string]*tf.Tensor, reps)
	for r := range feeds {
		var x [][]float32
		var y []int32
		for _, k := range perm[lo+r*per/reps : lo+(r+1)*per/reps] {
			x = append(x, j.train.X[k])
			y = append(y, j.train.Y[k])
		}
		xt, _ := tf.NewTensor(x)
		yt, _ := tf.NewTensor(y)
		feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
	}
	return feeds
}

// heldOut scores the held-out digits on every worker alike.
func (j *job) heldOut(ctx context.Context, s *multiworker.Strategy, model *nn.Model) (float64, error) {
	eval, err := s.Build(inputs, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := model.Apply(rc, in["x"], false)
		if err != nil {
			return nil, err
		}
		b := nn.NewBuilder(rc.Scope(), "eval")
		return strategy.Outputs{"correct": b.SumAll(nn.Correct(b.Op(), logits, in["y"]))}, nil
	})
	if err != nil {
		return 0, err
	}
	x, _ := tf.NewTensor(j.test.X)
	y, _ := tf.NewTensor(j.test.Y)
	feeds := make([]map[string]*tf.Tensor, s.NumLocalReplicas())
	for r := range feeds {
		feeds[r] = map[string]*tf.Tensor{"x": x, "y": y}
	}
	out, err := s.RunReplicas(ctx, eval, feeds, j.test.Len()*len(feeds)*s.NumWorkers())
	if err != nil {
		return 0, err
	}
	return float64(strategy.TensorValue(out["correct"][0]).(float32)) / float64(j.test.Len()), nil
}

// join joins the launcher's rendezvous, or, alone, one of its own.
func join(ctx context.Context) (*elastic.Member, error) {
	if os.Getenv(elastic.EnvRendezvous) != "" {
		return elastic.JoinFromEnv(ctx, 0)
	}
	srv, err := elastic.Listen("127.0.0.1:0", elastic.WithSettle(0))
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(ctx) }()
	return elastic.Join(ctx, srv.Addr(), elastic.Hello{Job: "elastic", Name: "worker:0"})
}

func main() {
	var o options
	flag.Int64Var(&o.steps, "steps", 600, "global steps to train")
	flag.IntVar(&o.globalBatch, "global-batch", 48, "examples per step across the workers: every worker count the job may have must divide it")
	flag.StringVar(&o.host, "host", "127.0.0.1", "the address other workers reach this one at")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the model and of each epoch's order")
	flag.IntVar(&o.shards, "deterministic", 0, "train topology-invariant with `V` virtual shards: the same bits whatever the workers (1, 2, 4, ... dividing V: tfdist launch --sizes)")
	flag.Parse()
	if err := train(o); err != nil {
		fmt.Fprintln(os.Stderr, "elastic:", err)
		os.Exit(1)
	}
}

func train(o options) error {
	data, err := digits.Load()
	if err != nil {
		return err
	}
	j := &job{o: o}
	j.train, j.test = data.Split(297, o.seed)
	ctx := context.Background()
	m, err := join(ctx)
	if errors.Is(err, elastic.ErrJobFinished) { // a replacement started too late
		fmt.Println("the job has finished")
		return nil
	}
	if err != nil {
		return err
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { <-term; m.LeaveSoon() }() // leave at the next step boundary
	var opts []multiworker.Option
	if o.shards > 0 {
		opts = append(opts, multiworker.WithDeterministic(o.shards))
	}
	var res result
	err = multiworker.RunElastic(ctx, m, o.host, func(ctx context.Context, s *multiworker.Strategy) error {
		if o.globalBatch%s.NumWorkers() != 0 {
			return fmt.Errorf("-global-batch %d does not divide among %d workers", o.globalBatch, s.NumWorkers())
		}
		res, err = j.run(ctx, s)
		return err
	}, opts...)
	switch {
	case errors.Is(err, multiworker.ErrModelMismatch):
		return fmt.Errorf("this worker's model is not the job's: %w", err)
	case err != nil:
		return err
	case m.Leaving():
		fmt.Println("left the job")
	case res.model == "":
		fmt.Println("the job has finished while this worker waited to join")
	default:
		fmt.Printf("held-out accuracy %.2f%%, model %.16s\n", 100*res.accuracy, res.model)
	}
	return nil
}
