// Command elastic trains the digits classifier as an elastic job: workers
// may die, be replaced, join or leave while it trains, and every example
// of every epoch is still trained on exactly once. Run it under the
// launcher, which runs the job's rendezvous and replaces a failed worker:
//
//	tfdist launch --elastic --min-workers 2 --max-workers 4 -- go run ./examples/elastic
//
// then kill a worker, or send the launcher SIGUSR1 (one worker more) or
// SIGUSR2 (one fewer). Each step trains the next -global-batch examples
// of a stream of the epochs' orders, divided among the workers, whoever
// they are; with -per-worker-batch B it follows the linear scaling rule
// instead: B examples a worker, at a learning rate in proportion. Where
// the job is in the stream is kept with its state (SetProgress), so that
// a new membership goes on from there. Alone, without the launcher, it
// runs a rendezvous of its own and trains as the only worker. It uses the
// public API only: copy it into a module of your own.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
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
	perWorker   int // the linear scaling rule's batch per worker, 0 without
	host        string
	seed        uint64
	shards      int // WithDeterministic's virtual shards, 0 without
}

// baseRate is the learning rate of a global batch of baseBatch examples;
// under the linear scaling rule a step's rate is in proportion to its
// global batch.
const (
	baseRate  = 0.05
	baseBatch = 48
)

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
	perms       []int // of epoch permEpoch
	permEpoch   int64
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
	rate := baseRate * float32(j.o.globalBatch) / baseBatch
	if j.o.perWorker > 0 { // the linear scaling rule: the rate follows the global batch
		rate = baseRate * float32(j.o.perWorker*s.NumWorkers()) / baseBatch
	}
	opt := optimizer.NewMomentum(optimizer.Constant(rate), 0.9, false)
	trainStep, err := s.Build(inputs, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
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
	step, err := s.Resume(ctx) // the state of the newest completed step
	if err != nil {
		return res, err
	}
	var pos int64 // the examples of the stream trained on (see share)
	if p := s.Progress(); p != nil {
		if pos, err = strconv.ParseInt(string(p), 10, 64); err != nil {
			return res, fmt.Errorf("the job's progress %q is not this program's", p)
		}
	}
	if s.IsChief() {
		fmt.Printf("%d workers from step %d\n", s.NumWorkers(), step)
	}
	for total := j.o.steps * int64(j.o.globalBatch); pos < total; step++ {
		global := j.o.globalBatch
		if j.o.perWorker > 0 {
			global = j.o.perWorker * s.NumWorkers()
		}
		global = int(min(int64(global), total-pos))
		out, err := s.RunReplicas(ctx, trainStep, j.share(s, pos, global), global)
		if err != nil {
			return res, err
		}
		if (step+1)%100 == 0 {
			loss, err := s.Reduce(ctx, strategy.Sum, out["loss"])
			if err != nil {
				return res, err
			}
			if s.IsChief() {
				fmt.Printf("step %d: loss %.4f\n", step+1, strategy.TensorValue(loss).(float32))
			}
		}
		pos += int64(global)
		s.SetProgress(strconv.AppendInt(nil, pos, 10)) // kept with the step's state
		if err := s.StepDone(ctx); err != nil {        // a change of members stops here
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

// share is this worker's part of the global batch of size examples at
// position pos of the stream, split among its local replicas. The stream
// is every epoch's permutation of the training examples, one after the
// other, which every worker computes alike; a step takes the next global
// batch of it, in contiguous parts (sizes differing by at most one) for
// the workers in rank order, so that whatever the members, each example
// of each epoch is trained on once.
func (j *job) share(s *multiworker.Strategy, pos int64, size int) []map[string]*tf.Tensor {
	n := int64(j.train.Len())
	w, workers := s.WorkerID(), s.NumWorkers()
	lo, hi := pos+int64(w*size/workers), pos+int64((w+1)*size/workers)
	reps := int64(s.NumLocalReplicas())
	feeds := make([]map[string]*tf.Tensor, reps)
	for r := range reps {
		x, y := []float32{}, []int32{} // a share may be empty: shaped [0, 64] and [0]
		for q := lo + r*(hi-lo)/reps; q < lo+(r+1)*(hi-lo)/reps; q++ {
			k := j.perm(q / n)[q%n]
			x = append(x, j.train.X[k]...)
			y = append(y, j.train.Y[k])
		}
		xt, _ := tf.NewTensor(x)
		_ = xt.Reshape([]int64{int64(len(y)), digits.Features})
		yt, _ := tf.NewTensor(y)
		feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
	}
	return feeds
}

// perm is epoch's order of the training examples.
func (j *job) perm(epoch int64) []int {
	if j.permEpoch != epoch || j.perms == nil {
		j.perms, j.permEpoch = rand.New(rand.NewPCG(j.o.seed, uint64(epoch))).Perm(j.train.Len()), epoch
	}
	return j.perms
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
	flag.IntVar(&o.globalBatch, "global-batch", baseBatch, "examples per step across the workers")
	flag.IntVar(&o.perWorker, "per-worker-batch", 0, "the linear scaling rule: each step takes `B` examples per worker, at a learning rate in proportion, over the examples of -steps × -global-batch (0: a fixed global batch)")
	flag.StringVar(&o.host, "host", cmp.Or(os.Getenv(elastic.EnvHost), "127.0.0.1"), "the address other workers reach this one at ($TFDIST_HOST by default, as tfdist launch sets it)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the model and of each epoch's order")
	flag.IntVar(&o.shards, "deterministic", 0, "train topology-invariant with `V` virtual shards: the same bits whatever the workers (1, 2, 4, ... dividing V: tfdist launch --sizes)")
	flag.Parse()
	if o.steps < 1 || o.globalBatch < 1 {
		fmt.Fprintf(os.Stderr, "elastic: -steps %d, -global-batch %d: expected at least 1 each\n", o.steps, o.globalBatch)
		os.Exit(2)
	}
	if o.perWorker < 0 || o.perWorker > 0 && o.shards > 0 {
		fmt.Fprintf(os.Stderr, "elastic: -per-worker-batch %d: expected 0, or more without -deterministic (the linear scaling rule trains another model on another number of workers)\n", o.perWorker)
		os.Exit(2)
	}
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
