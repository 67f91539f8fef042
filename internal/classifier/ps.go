package classifier

import (
	"context"
	"fmt"
	"io"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/trainloop"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// psChunk is the most steps the chief schedules before it joins them: a
// chunk also ends at every progress line and checkpoint, which need a
// consistent point.
const psChunk = 100

// ps is a session of the parameter-server strategy. On the ps and worker
// tasks newPSSession serves until the job ends and returns
// paramserver.ErrNotChief; on the chief the steps, of -global-batch
// examples each, run on whichever worker is free, asynchronously, and the
// model is evaluated on the workers.
type ps struct {
	o           Options
	s           *paramserver.Strategy
	c           *paramserver.Coordinator
	m           *nn.Sequential
	train, eval *paramserver.Function
	data        digits.Data
	mgr         *checkpoint.Manager
}

// newPSSession joins the cluster of TF_CONFIG, builds the model and its
// steps, and fills in res's replicas, workers and chief.
func newPSSession(ctx context.Context, o Options, train digits.Data, res *Result) (*ps, error) {
	if o.Devices != 1 {
		return nil, fmt.Errorf("-strategy ps: -devices %d: each worker runs its steps on one device", o.Devices)
	}
	if f := o.Faults; f.CrashAtStep > 0 && f.CrashTask != "" && f.CrashTask != "chief:0" {
		return nil, fmt.Errorf("-strategy ps: Faults.CrashTask %s: only the chief runs the training loop; use chief:0 (kill ps and worker tasks from outside)", f.CrashTask)
	}
	log, err := o.logger()
	if err != nil {
		return nil, err
	}
	s, err := paramserver.New(ctx, nil, paramserver.WithLogger(log))
	if err != nil {
		return nil, err
	}
	p := &ps{o: o, s: s, data: train}
	res.Chief, res.Workers, res.Replicas = true, s.NumWorkers(), s.NumWorkers()
	if err := p.build(); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *ps) build() error {
	b, err := buildModel(p.o, p.s.Scope, p.s.Build, false)
	if err != nil {
		return err
	}
	p.m, p.train, p.eval = b.m, b.train, b.eval
	if p.c, err = paramserver.NewCoordinator(p.s); err != nil {
		return err
	}
	if p.o.CheckpointDir != "" {
		p.mgr, err = checkpoint.NewManager(p.s, p.o.CheckpointDir)
	}
	return err
}

func (p *ps) model() *nn.Sequential { return p.m }

func (p *ps) restore(ctx context.Context) (int, error) {
	if p.mgr == nil {
		return 0, nil
	}
	done, _, err := p.mgr.RestoreLatest(ctx)
	return int(done), err
}

// trainer starts each worker's input, a shard of the training data in an
// order of its own; after a resume the pipelines start afresh (the steps
// done are not replayed: asynchronous training has no global input order).
// A chunk of steps is scheduled and joined; its loss is the mean of its
// steps'.
func (p *ps) trainer(_ context.Context, start int, times *stepTimes) (trainloop.Trainer, int, error) {
	input, err := p.c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		ds, err := dataset.FromSlices(map[string]any{"x": p.data.X, "y": p.data.Y})
		if err != nil {
			return nil, err
		}
		ds = dataset.Shard(ds, ictx.NumInputPipelines, ictx.InputPipelineID)
		seed := p.o.Seed + uint64(ictx.InputPipelineID) + uint64(start)
		return dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, p.data.Len(), seed), -1), p.o.GlobalBatch, true), nil
	})
	if err != nil {
		return nil, 0, err
	}
	return trainloop.TrainerFunc(func(ctx context.Context, n int, _ bool) (float64, error) {
		rvs := make([]*paramserver.RemoteValue, n)
		for i := range rvs {
			var err error
			if rvs[i], err = p.c.Schedule(p.train, input); err != nil {
				return 0, err
			}
		}
		if err := p.c.Join(ctx); err != nil {
			return 0, err
		}
		sum, err := sumOutputs(ctx, rvs, "loss")
		for _, rv := range rvs {
			info := rv.Info()
			times.add(info.Worker, info.Ran)
		}
		return sum / float64(n), err
	}), psChunk, nil
}

func (p *ps) checkpoint(ctx context.Context, step int) error {
	_, err := p.mgr.Save(ctx, int64(step), nil)
	return err
}

// finish reports the updates the ps tasks applied and what the coordinator
// saw of the workers.
func (p *ps) finish(ctx context.Context, res *Result, log io.Writer) error {
	var err error
	if res.AppliedSteps, err = p.s.AppliedSteps(ctx); err != nil {
		return err
	}
	st := p.c.Stats()
	fmt.Fprintf(log, "ps: %d steps scheduled, %d updates applied; steps per worker %v, %d worker failure(s), %d worker(s) taken back\n",
		st.Scheduled, res.AppliedSteps, st.PerWorker, st.WorkerFailures, st.Reconnects)
	return nil
}

// evaluate scores test in batches scheduled on the workers.
func (p *ps) evaluate(ctx context.Context, test digits.Data) (float64, error) {
	var rvs []*paramserver.RemoteValue
	for lo := 0; lo < test.Len(); lo += p.o.GlobalBatch {
		hi := min(lo+p.o.GlobalBatch, test.Len())
		x, err := tf.NewTensor(test.X[lo:hi])
		if err != nil {
			return 0, err
		}
		y, err := tf.NewTensor(test.Y[lo:hi])
		if err != nil {
			return 0, err
		}
		rv, err := p.c.Schedule(p.eval, paramserver.Feed(dataset.Element{"x": x, "y": y}))
		if err != nil {
			return 0, err
		}
		rvs = append(rvs, rv)
	}
	correct, err := sumOutputs(ctx, rvs, "correct")
	return correct / float64(test.Len()), err
}

// sumOutputs waits for rvs and sums their float32 output name.
func sumOutputs(ctx context.Context, rvs []*paramserver.RemoteValue, name string) (float64, error) {
	var sum float64
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		if err != nil {
			return 0, err
		}
		sum += float64(tensorutil.Value(out[name]).(float32))
	}
	return sum, nil
}

func (p *ps) strategy() strategy.ValueReader { return p.s }

func (p *ps) privacy() *privacy { return nil }

func (p *ps) close() error {
	if p.c != nil {
		p.c.Done(context.Background())
	}
	return p.s.Close()
}
