package train

import (
	"context"
	"errors"
	"fmt"
	"io"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/timeline"
)

// Logs are the values a step or an epoch reports, by name: "loss", each
// metric's name, and after validation "val_loss" and "val_" + each
// metric's name, as Keras's logs.
type Logs map[string]float64

// History is what Fit returns: for each key of the epochs' Logs, its
// value at every epoch that had it (validation keys only at the epochs
// that validated), as Keras's History.history.
type History struct {
	// Epochs lists the epochs trained, from the initial epoch.
	Epochs []int
	// Values holds each key's values, in epoch order.
	Values map[string][]float64
}

func (h *History) add(epoch int, logs Logs) {
	h.Epochs = append(h.Epochs, epoch)
	for k, v := range logs {
		h.Values[k] = append(h.Values[k], v)
	}
}

// FitOption configures Fit.
type FitOption func(*fitConfig)

type fitConfig struct {
	epochs, stepsPerEpoch, initialEpoch int
	perReplica                          *int // PerReplicaBatch's, nil without
	val                                 dataset.Dataset
	valStep                             any // the test step, built for val
	valSteps, valFreq                   int
	callbacks                           []Callback
}

// Epochs sets the epoch training ends after (default 1), counting the
// initial epoch: Keras's epochs.
func Epochs(n int) FitOption { return func(c *fitConfig) { c.epochs = n } }

// StepsPerEpoch ends each epoch after n steps instead of at the end of a
// pass over the data; the next epoch goes on from where the input is,
// starting a new pass when one ends. The parameter-server strategy needs
// it.
func StepsPerEpoch(n int) FitOption { return func(c *fitConfig) { c.stepsPerEpoch = n } }

// PerReplicaBatch follows the linear scaling rule: ds holds single
// examples, not batches, and each step takes b of them per replica. Fit
// batches ds by b × the strategy's replicas in sync (of each membership,
// in an elastic job, where the global batch then changes with the
// workers), the last batch of an epoch holding what remains, and trains at
// the learning rate compiled or set (one replica's) times the replicas.
// The optimizer's schedule must be an optimizer.Adjustable, which keeps
// the scaled rate: callbacks that read or set the rate (ReduceLROnPlateau,
// LearningRateScheduler) see it, it stays so after Fit, and a later Fit
// with PerReplicaBatch scales it from there. A resumed Fit (an elastic
// job's, BackupAndRestore's) skips the examples its epoch trained,
// whatever the global batch was. Validation data stays batched.
// StepsPerEpoch and the parameter-server strategy cannot go with it.
func PerReplicaBatch(b int) FitOption { return func(c *fitConfig) { c.perReplica = &b } }

// InitialEpoch sets the epoch training starts at (default 0).
func InitialEpoch(n int) FitOption { return func(c *fitConfig) { c.initialEpoch = n } }

// ValidationData evaluates the model on ds at the end of epochs (every
// freq-th: ValidationFreq), adding "val_" logs.
func ValidationData(ds dataset.Dataset) FitOption { return func(c *fitConfig) { c.val = ds } }

// ValidationSteps bounds each validation to n batches (default: the whole
// validation data).
func ValidationSteps(n int) FitOption { return func(c *fitConfig) { c.valSteps = n } }

// ValidationFreq validates after every n-th epoch (default 1).
func ValidationFreq(n int) FitOption { return func(c *fitConfig) { c.valFreq = n } }

// WithCallbacks adds callbacks, called in the order given.
func WithCallbacks(cbs ...Callback) FitOption {
	return func(c *fitConfig) { c.callbacks = append(c.callbacks, cbs...) }
}

func newFitConfig(opts []FitOption) (fitConfig, error) {
	c := fitConfig{epochs: 1, valFreq: 1}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.epochs < 1:
		return c, fmt.Errorf("Epochs(%d): expected at least 1", c.epochs)
	case c.stepsPerEpoch < 0:
		return c, fmt.Errorf("StepsPerEpoch(%d): expected 0 (a pass per epoch) or more", c.stepsPerEpoch)
	case c.initialEpoch < 0 || c.initialEpoch >= c.epochs:
		return c, fmt.Errorf("InitialEpoch(%d): expected 0 to Epochs-1 = %d", c.initialEpoch, c.epochs-1)
	case c.valSteps < 0:
		return c, fmt.Errorf("ValidationSteps(%d): expected 0 (every batch) or more", c.valSteps)
	case c.valFreq < 1:
		return c, fmt.Errorf("ValidationFreq(%d): expected at least 1", c.valFreq)
	case c.perReplica != nil && *c.perReplica < 1:
		return c, fmt.Errorf("PerReplicaBatch(%d): expected at least 1 example per replica", *c.perReplica)
	case c.perReplica != nil && c.stepsPerEpoch > 0:
		return c, fmt.Errorf("PerReplicaBatch(%d) with StepsPerEpoch(%d): the steps of a pass change with the replicas; use one or the other", *c.perReplica, c.stepsPerEpoch)
	}
	for i, cb := range c.callbacks {
		if cb == nil {
			return c, fmt.Errorf("WithCallbacks: callback %d is nil", i)
		}
	}
	return c, nil
}

// Fit trains the model on ds, a dataset batched by the global batch size
// whose elements hold the model's inputs, "y" and optionally
// "sample_weight": for Epochs epochs, each a pass over ds or StepsPerEpoch
// steps, calling the callbacks as it goes. Under a synchronous strategy
// every worker calls Fit with the same arguments; under parameter servers
// the chief does. Everything Fit can check before the first step — the
// options, the data's keys, types and shapes against the model, the loss
// and metrics against the outputs — is an error before it.
func (t *Trainer) Fit(ctx context.Context, ds dataset.Dataset, opts ...FitOption) (*History, error) {
	h, err := t.fit(ctx, ds, opts)
	if err != nil {
		return h, fmt.Errorf("train: Fit: %w", err)
	}
	return h, nil
}

func (t *Trainer) fit(ctx context.Context, ds dataset.Dataset, opts []FitOption) (*History, error) {
	c, err := newFitConfig(opts)
	if err != nil {
		return nil, err
	}
	batches, global := ds, 0
	if c.perReplica != nil {
		if batches, global, err = t.scaledBatches(ctx, ds, *c.perReplica); err != nil {
			return nil, err
		}
	}
	st, err := t.stepFor(ctx, trainStep, batches, "training data")
	if err != nil {
		return nil, err
	}
	if c.val != nil {
		if c.valStep, err = t.stepFor(ctx, testStep, c.val, "validation data"); err != nil {
			return nil, err
		}
	}
	f, err := t.feed(ds, batches, global, c.stepsPerEpoch)
	if err != nil {
		return nil, err
	}
	defer f.close()
	r := &Run{t: t, Epochs: c.epochs, StepsPerEpoch: c.stepsPerEpoch, cbs: callbacks(c.callbacks)}
	if global > 0 {
		r.replicas = global / *c.perReplica
	}
	if c.val != nil {
		r.ValidationFreq = c.valFreq
	}
	h := &History{Values: map[string][]float64{}}
	if err := t.resumeElastic(ctx, r, h); err != nil {
		return h, err
	}
	if err := t.epochs(ctx, r, f, st, c, h); err != nil {
		r.cbs.close()
		return h, err
	}
	return h, nil
}

// feed returns Fit's input: batches, or under PerReplicaBatch (global >
// 0) the examples batches holds batched by global.
func (t *Trainer) feed(examples, batches dataset.Dataset, global, stepsPerEpoch int) (feed, error) {
	if global > 0 {
		return t.eng.(*syncEngine).exampleFeed(examples, batches, global)
	}
	return t.eng.feed(batches, stepsPerEpoch)
}

// epochs runs the callbacks' train hooks around every epoch.
func (t *Trainer) epochs(ctx context.Context, r *Run, f feed, st any, c fitConfig, h *History) error {
	if err := r.cbs.trainBegin(ctx, r); err != nil {
		return err
	}
	if err := t.scaleRate(ctx, r); err != nil {
		return fmt.Errorf("PerReplicaBatch: %w", err)
	}
	var logs Logs
	if r.elastic != nil {
		logs = r.elastic.logs // of the epoch before the one resumed at
	}
	for epoch := max(c.initialEpoch, r.resumeEpoch); epoch < c.epochs && !r.stop; epoch++ {
		var err error
		if logs, err = t.epoch(ctx, r, f, st, epoch, c); err != nil {
			return fmt.Errorf("epoch %d: %w", epoch, err)
		}
		h.add(epoch, logs)
		if r.elastic != nil {
			r.elastic.logs = logs
			if err := r.keepProgress(ctx, epoch+1, 0, nil); err != nil {
				return fmt.Errorf("end of epoch %d: %w", epoch, err)
			}
		}
	}
	return r.cbs.trainEnd(ctx, r, logs)
}

// epoch trains one epoch and validates if due.
func (t *Trainer) epoch(ctx context.Context, r *Run, f feed, st any, epoch int, c fitConfig) (Logs, error) {
	r.epoch = epoch
	step := 0
	if r.resumed && epoch == r.resumeEpoch {
		step = r.resumeStep
		if err := f.skip(ctx, epoch-c.initialEpoch, position{step, examplesIn(r.resumeTotals)}); err != nil {
			return nil, err
		}
	} else if err := f.startEpoch(ctx); err != nil {
		return nil, err
	}
	if err := r.cbs.epochBegin(ctx, r, epoch); err != nil {
		return nil, err
	}
	acc := t.newTotals()
	if r.resumed && epoch == r.resumeEpoch && r.resumeTotals != nil {
		if err := acc.set(r.resumeTotals); err != nil {
			return nil, err
		}
	}
	r.acc = acc
	trained := 0
	for (c.stepsPerEpoch == 0 || step < c.stepsPerEpoch) && !r.stop {
		n := f.chunk()
		if c.stepsPerEpoch > 0 {
			n = min(n, c.stepsPerEpoch-step)
		}
		for i := range n {
			if err := r.cbs.batchBegin(ctx, r, step+i); err != nil {
				return nil, err
			}
		}
		k := step
		ran, err := f.run(ctx, st, n, func(logs []float64) error {
			r.steps++
			k++
			if logs != nil { // nil: a micro-step that only accumulated
				acc.add(logs)
				if err := t.stepEnded(ctx, r, logs); err != nil {
					return err
				}
			}
			if err := r.cbs.batchEnd(ctx, r, k-1, acc.logs("")); err != nil {
				return err
			}
			return r.keepProgress(ctx, epoch, k, acc.values())
		})
		step, trained = step+ran, trained+ran
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		if ran < n {
			break
		}
	}
	if trained == 0 && step == 0 && !r.stop {
		return nil, errors.New("the training data has no batch")
	}
	logs := acc.logs("")
	if c.val != nil && (epoch+1)%c.valFreq == 0 {
		val, err := t.evaluate(ctx, c.valStep, c.val, c.valSteps)
		if err != nil {
			return nil, fmt.Errorf("validation: %w", err)
		}
		for k, v := range val {
			logs["val_"+k] = v
		}
	}
	err := r.cbs.epochEnd(ctx, r, epoch, logs)
	t.epochEnded(logs)
	return logs, err
}

// stepFor builds (or finds) the step of kind for the elements of ds,
// which it reads the first of; what names the data in errors.
func (t *Trainer) stepFor(ctx context.Context, kind stepKind, ds dataset.Dataset, what string) (any, error) {
	e, err := firstElement(ctx, ds)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	st, _, err := t.step(kind, e)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return st, nil
}

// firstElement reads the first element of ds.
func firstElement(ctx context.Context, ds dataset.Dataset) (dataset.Element, error) {
	if ds == nil {
		return nil, errors.New("nil dataset")
	}
	it, err := ds.Iterator(ctx)
	if err != nil {
		return nil, err
	}
	defer it.Close()
	e, err := it.Next(ctx)
	if err == io.EOF {
		return nil, errors.New("the dataset has no element")
	}
	return e, err
}

// Evaluate returns the loss and the metrics of the model over every batch
// of ds (at most steps batches, when steps > 0), as Keras's evaluate:
// exact over the whole dataset, each example counted once across workers.
// Under a synchronous strategy every worker calls it and gets the same
// logs.
func (t *Trainer) Evaluate(ctx context.Context, ds dataset.Dataset, steps int) (Logs, error) {
	if steps < 0 {
		return nil, fmt.Errorf("train: Evaluate: steps %d, expected 0 (every batch) or more", steps)
	}
	st, err := t.stepFor(ctx, testStep, ds, "evaluation data")
	if err == nil {
		var logs Logs
		if logs, err = t.evaluate(ctx, st, ds, steps); err == nil {
			return logs, nil
		}
	}
	return nil, fmt.Errorf("train: Evaluate: %w", err)
}

// evaluate runs the test step st on ds and adds up its logs.
func (t *Trainer) evaluate(ctx context.Context, st any, ds dataset.Dataset, steps int) (Logs, error) {
	defer t.timeline().Begin(timeline.Evaluate, "evaluate")(nil)
	acc := t.newTotals()
	if err := t.eng.evaluate(ctx, st, ds, steps, func(logs []float64) error { acc.add(logs); return nil }); err != nil {
		return nil, err
	}
	return acc.logs(""), nil
}

// Predict returns the model's output for every example of ds (at most
// steps batches, when steps > 0), in the data's order, in inference mode:
// Keras's predict. Under a synchronous strategy every worker calls it and
// gets every prediction.
func (t *Trainer) Predict(ctx context.Context, ds dataset.Dataset, steps int) (*tf.Tensor, error) {
	if steps < 0 {
		return nil, fmt.Errorf("train: Predict: steps %d, expected 0 (every batch) or more", steps)
	}
	st, err := t.stepFor(ctx, predictStep, ds, "prediction data")
	if err != nil {
		return nil, fmt.Errorf("train: Predict: %w", err)
	}
	parts, err := t.eng.predict(ctx, st, ds, steps)
	if err == nil {
		var out *tf.Tensor
		if out, err = concatRows(parts); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("train: Predict: %w", err)
}

// totals adds up the logs of steps.
type totals struct {
	metrics     []Metric
	sizes       []int
	loss, count float64
	sums        []float64
}

func (t *Trainer) newTotals() *totals {
	n := 0
	for _, k := range t.sizes {
		n += k
	}
	return &totals{metrics: t.cfg.metrics, sizes: t.sizes, sums: make([]float64, n)}
}

// add adds one step's logs: its mean loss, its examples, the metrics'
// sums.
func (a *totals) add(logs []float64) {
	a.loss += logs[0] * logs[1]
	a.count += logs[1]
	for i := range a.sums {
		a.sums[i] += logs[2+i]
	}
}

// values returns the totals as one vector: the loss, the examples, the
// metrics' sums.
func (a *totals) values() []float64 { return append([]float64{a.loss, a.count}, a.sums...) }

// examplesIn returns the examples an epoch's totals (values) count.
func examplesIn(totals []float64) int {
	if len(totals) < 2 {
		return 0
	}
	return int(totals[1])
}

// set sets the totals from values.
func (a *totals) set(v []float64) error {
	if len(v) != 2+len(a.sums) {
		return fmt.Errorf("resuming: %d totals of the epoch's logs, expected %d (loss, examples, %d metric sums)", len(v), 2+len(a.sums), len(a.sums))
	}
	a.loss, a.count = v[0], v[1]
	copy(a.sums, v[2:])
	return nil
}

func (a *totals) logs(prefix string) Logs {
	out := Logs{prefix + "loss": 0}
	if a.count > 0 {
		out[prefix+"loss"] = a.loss / a.count
	}
	off := 0
	for i, m := range a.metrics {
		out[prefix+m.Name()] = m.Result(a.sums[off : off+a.sizes[i]])
		off += a.sizes[i]
	}
	return out
}
