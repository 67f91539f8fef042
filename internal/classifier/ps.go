package classifier

import (
	"context"
	"fmt"
	"io"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// runPS trains with the parameter-server strategy. On the ps and worker
// tasks it serves until the job ends and returns paramserver.ErrNotChief;
// on the chief it schedules -steps steps of -global-batch examples each,
// every step one worker's, asynchronously, and evaluates on the workers.
func runPS(ctx context.Context, o Options, log io.Writer) (Result, error) {
	res := Result{Strategy: o.Strategy, GlobalBatch: o.GlobalBatch, Steps: o.Steps}
	if o.Devices != 1 {
		return res, fmt.Errorf("-strategy ps: -devices %d: each worker runs its steps on one device", o.Devices)
	}
	crash, err := crashPlanFromEnv()
	if err != nil {
		return res, err
	}
	if crash.step > 0 && crash.task != "" && crash.task != "chief:0" {
		return res, fmt.Errorf("-strategy ps: %s=%s: only the chief runs the training loop; use chief:0 (kill ps and worker tasks from outside)", EnvCrashTask, crash.task)
	}
	opt, err := newOptimizer(o)
	if err != nil {
		return res, err
	}
	s, err := paramserver.New(ctx, nil)
	if err != nil {
		return res, err
	}
	defer s.Close()
	res.Chief, res.Workers, res.Replicas = true, s.NumWorkers(), s.NumWorkers()

	data, err := digits.Load()
	if err != nil {
		return res, err
	}
	train, test := data.Split(o.TestSize, o.Seed)
	var model *nn.Sequential
	if err := s.Scope(func(sc strategy.Scope) error {
		model, err = models.New(sc, o.Model, o.Hidden, int64(o.Seed))
		return err
	}); err != nil {
		return res, err
	}
	trainFn, err := s.Build(models.Spec, models.TrainStep(model, opt))
	if err != nil {
		return res, err
	}
	evalFn, err := s.Build(models.Spec, models.EvalStep(model))
	if err != nil {
		return res, err
	}
	c, err := paramserver.NewCoordinator(s)
	if err != nil {
		return res, err
	}
	defer c.Done(context.Background())

	step := 0
	var mgr *checkpoint.Manager
	if o.CheckpointDir != "" {
		if mgr, err = paramserver.NewCheckpointManager(s, o.CheckpointDir); err != nil {
			return res, err
		}
		done, _, err := mgr.RestoreLatest(ctx)
		if err != nil {
			return res, err
		}
		if done > 0 {
			fmt.Fprintf(log, "resuming after step %d from %s\n", done, o.CheckpointDir)
		}
		step = int(min(done, int64(o.Steps)))
	}
	// Each worker reads its shard of the training data, in its own order;
	// after a resume the pipelines start afresh (the steps done are not
	// replayed: asynchronous training has no global input order).
	input, err := c.CreatePerWorkerDataset(func(ictx dataset.InputContext) (dataset.Dataset, error) {
		ds, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
		if err != nil {
			return nil, err
		}
		ds = dataset.Shard(ds, ictx.NumInputPipelines, ictx.InputPipelineID)
		seed := o.Seed + uint64(ictx.InputPipelineID) + uint64(step)
		return dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, train.Len(), seed), -1), o.GlobalBatch, true), nil
	})
	if err != nil {
		return res, err
	}

	armed := crash.armed()
	// Schedule in chunks: Join between chunks gives checkpoints and
	// progress lines a consistent point.
	chunk := 50
	if mgr != nil {
		chunk = o.CheckpointEvery
	} else if o.LogEvery > 0 {
		chunk = o.LogEvery
	}
	start, first := time.Now(), step
	for step < o.Steps {
		n := min(chunk, o.Steps-step)
		rvs := make([]*paramserver.RemoteValue, n)
		for i := range rvs {
			if rvs[i], err = c.Schedule(trainFn, input); err != nil {
				return res, fmt.Errorf("step %d: %w", step+i, err)
			}
		}
		if err := c.Join(ctx); err != nil {
			return res, fmt.Errorf("steps %d..%d: %w", step, step+n-1, err)
		}
		var sum float64
		for _, rv := range rvs {
			out, err := rv.Get(ctx)
			if err != nil {
				return res, err
			}
			sum += float64(out["loss"].Value().(float32))
		}
		res.FinalLoss = sum / float64(n)
		step += n
		if mgr != nil {
			if _, err := mgr.Save(ctx, int64(step), nil); err != nil {
				return res, err
			}
		}
		if o.LogEvery > 0 {
			rate := float64((step-first)*o.GlobalBatch) / time.Since(start).Seconds()
			fmt.Fprintf(log, "step %4d/%d  loss %.4f  %.0f examples/s\n", step, o.Steps, res.FinalLoss, rate)
		}
		if armed {
			crash.crashIfDue(log, step)
		}
	}
	if el := time.Since(start).Seconds(); el > 0 && step > first {
		res.ExamplesPerSec = float64((step-first)*o.GlobalBatch) / el
	}
	if res.AppliedSteps, err = s.AppliedSteps(ctx); err != nil {
		return res, err
	}
	st := c.Stats()
	fmt.Fprintf(log, "ps: %d steps scheduled, %d updates applied; steps per worker %v, %d worker failure(s), %d worker(s) taken back\n",
		st.Scheduled, res.AppliedSteps, st.PerWorker, st.WorkerFailures, st.Reconnects)

	var rvs []*paramserver.RemoteValue
	for lo := 0; lo < test.Len(); lo += o.GlobalBatch {
		hi := min(lo+o.GlobalBatch, test.Len())
		x, err := tf.NewTensor(test.X[lo:hi])
		if err != nil {
			return res, err
		}
		y, err := tf.NewTensor(test.Y[lo:hi])
		if err != nil {
			return res, err
		}
		rv, err := c.Schedule(evalFn, paramserver.Feed(dataset.Element{"x": x, "y": y}))
		if err != nil {
			return res, err
		}
		rvs = append(rvs, rv)
	}
	var correct float64
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		if err != nil {
			return res, err
		}
		correct += float64(out["correct"].Value().(float32))
	}
	res.Accuracy = correct / float64(test.Len())
	res.ParamL2, err = paramL2(ctx, model.Vars(), s.Value)
	return res, err
}
