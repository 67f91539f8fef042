package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/internal/tensorutil"
)

// Coordinator schedules steps on the workers of a parameter-server cluster,
// as tf.distribute.experimental.coordinator.ClusterCoordinator: Schedule
// queues a step and returns at once; each worker runs one step at a time,
// taking the next from the queue as soon as it is free, so that as many
// steps run at once as there are workers; Join waits for everything
// scheduled.
//
// Workers may fail. A step whose worker dies (its server does not answer
// the run, or answers as a new server, restarted at its address; or the
// run goes past WithStepTimeout; or the worker stops answering the
// heartbeat that pings it while the step runs; or the worker cannot reach
// a ps task that the chief reaches) goes back to the front of the queue with the same
// input and runs on another worker; its update is applied once (see
// Function). The dead worker's loop probes it in the background, with
// backoff, and takes steps again once it answers: a worker restarted at its
// address (by tfdist launch, or Kubernetes) is taken back. A step that
// fails with an error of its own (bad input, an op's error) is not retried:
// its RemoteValue and Join report the error. A step that fails as if its
// worker died on WithMaxAttempts runs in a row is reported too, never
// retried forever.
//
// A ps task that fails ends training: the coordinator fails every pending
// step, and every later Schedule, with a *PSFailureError.
type Coordinator struct {
	s   *Strategy
	cfg coordConfig
	log *zap.Logger

	ctx    context.Context // the loops' lifetime
	cancel context.CancelFunc
	loops  sync.WaitGroup

	mu        sync.Mutex
	queue     []*closure
	wake      chan struct{} // closed when the queue grows
	pending   int           // scheduled and not resolved
	idle      chan struct{} // closed while pending == 0
	firstErr  error
	fatal     error
	done      bool
	alive     []bool
	lastErr   []error
	deadSince time.Time
	stats     Stats
	datasets  []*PerWorkerDataset
}

// CoordinatorOption configures NewCoordinator.
type CoordinatorOption func(*coordConfig)

type coordConfig struct {
	maxAttempts  int
	workerWait   time.Duration
	probeMin     time.Duration
	probeMax     time.Duration
	probeTimeout time.Duration
	heartbeat    time.Duration
}

// WithMaxAttempts sets how many times a step may run and fail as if its
// worker died before it is reported as failed (default: the number of
// workers plus 2).
func WithMaxAttempts(n int) CoordinatorOption { return func(c *coordConfig) { c.maxAttempts = n } }

// WithWorkerWaitTimeout sets how long scheduled steps wait while no worker
// is up before they fail with a *NoWorkerError (default 5 minutes).
func WithWorkerWaitTimeout(d time.Duration) CoordinatorOption {
	return func(c *coordConfig) { c.workerWait = d }
}

// WithProbeInterval sets the backoff between probes of a dead worker: from
// min, doubling up to max (default 100 ms to 5 s).
func WithProbeInterval(min, max time.Duration) CoordinatorOption {
	return func(c *coordConfig) { c.probeMin, c.probeMax = min, max }
}

// WithHeartbeat sets how often the coordinator checks that a worker running
// a step still answers (default 500 ms); a worker that fails two
// checks in a row is treated as dead and its step rescheduled.
func WithHeartbeat(d time.Duration) CoordinatorOption {
	return func(c *coordConfig) { c.heartbeat = d }
}

// Stats counts what a Coordinator did.
type Stats struct {
	// Scheduled, Succeeded and Failed count steps.
	Scheduled, Succeeded, Failed int
	// EndOfData counts the steps that resolved with ErrEndOfData: their
	// PerWorkerDataset had ended on every worker. They are not Failed.
	EndOfData int
	// Retries counts runs repeated because a worker failed.
	Retries int
	// SkippedUpdates counts reruns whose update a previous run had already
	// applied, so the rerun did not apply it again.
	SkippedUpdates int
	// WorkerFailures counts the times a worker was found dead.
	WorkerFailures int
	// Reconnects counts the times a worker that had failed came back.
	Reconnects int
	// PerWorker counts the steps each worker completed.
	PerWorker []int
	// Alive says which workers are up now.
	Alive []bool
}

// NewCoordinator starts scheduling on s's workers: one loop per worker
// connects to it and runs the steps it takes from the queue. A strategy has
// one coordinator at a time.
func NewCoordinator(s *Strategy, opts ...CoordinatorOption) (*Coordinator, error) {
	if s == nil {
		return nil, errors.New("paramserver: NewCoordinator: nil strategy")
	}
	cfg := coordConfig{maxAttempts: len(s.workers) + 2, workerWait: 5 * time.Minute,
		probeMin: 100 * time.Millisecond, probeMax: 5 * time.Second, probeTimeout: time.Second, heartbeat: 500 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.maxAttempts < 1:
		return nil, fmt.Errorf("paramserver: WithMaxAttempts(%d): expected at least 1", cfg.maxAttempts)
	case cfg.workerWait <= 0:
		return nil, fmt.Errorf("paramserver: WithWorkerWaitTimeout(%v): expected a positive duration", cfg.workerWait)
	case cfg.heartbeat <= 0:
		return nil, fmt.Errorf("paramserver: WithHeartbeat(%v): expected a positive duration", cfg.heartbeat)
	case cfg.probeMin <= 0 || cfg.probeMax < cfg.probeMin:
		return nil, fmt.Errorf("paramserver: WithProbeInterval(%v, %v): expected 0 < min <= max", cfg.probeMin, cfg.probeMax)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.coord != nil && !s.coord.isDone() {
		return nil, errors.New("paramserver: NewCoordinator: the strategy already has a coordinator; call its Done first")
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := len(s.workers)
	c := &Coordinator{s: s, cfg: cfg, log: s.log, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}), idle: closedChan(), alive: make([]bool, n), lastErr: make([]error, n),
		deadSince: time.Now(), stats: Stats{PerWorker: make([]int, n)}}
	for i := range c.lastErr {
		c.lastErr[i] = errors.New("not connected yet")
	}
	s.coord = c
	for _, w := range s.workers {
		c.loops.Add(1)
		go c.loop(w)
	}
	c.loops.Add(1)
	go c.watchdog()
	return c, nil
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// Input is what a scheduled step is fed: a fixed batch (Feed), or the next
// element of the dataset of the worker the step runs on (a
// PerWorkerDataset). An input is taken once per step: a step run again
// after its worker died is fed the same element.
type Input interface {
	element(ctx context.Context, worker int) (dataset.Element, error)
}

// Feed returns an Input that feeds e to the step, whichever worker runs it.
func Feed(e dataset.Element) Input { return feedInput(e) }

type feedInput dataset.Element

func (f feedInput) element(context.Context, int) (dataset.Element, error) {
	return dataset.Element(f), nil
}

// PerWorkerDataset is one dataset per worker, created once per worker by a
// function of the worker's InputContext: a step scheduled with it takes the
// next element of the dataset of the worker it runs on. Each worker's
// pipeline runs in the chief and feeds that worker only; it survives the
// worker's failure.
//
// The datasets may end, each at its own element. A step that finds its
// worker's dataset ended goes back to the front of the queue, is not
// counted as a failure, and is taken by a worker whose dataset still has
// data; the coordinator no longer gives that worker steps on this dataset.
// Once the dataset has ended on every worker, the steps still waiting for
// an element resolve with ErrEndOfData, and so does every later Schedule
// with it.
type PerWorkerDataset struct {
	c   *Coordinator
	ds  []dataset.Dataset
	mu  []sync.Mutex // guards its[i] and consumed[i]
	its []dataset.Iterator
	// consumed counts the elements each worker's dataset has given.
	consumed []int
	// ended says which workers' datasets have ended, nEnded how many;
	// guarded by c.mu.
	ended  []bool
	nEnded int
}

// CreatePerWorkerDataset calls fn once per worker, with InputContext
// {NumInputPipelines: workers, InputPipelineID: worker,
// NumReplicasInSync: 1} (each step is one worker's), and returns the
// datasets as one Input.
func (c *Coordinator) CreatePerWorkerDataset(fn func(dataset.InputContext) (dataset.Dataset, error)) (*PerWorkerDataset, error) {
	if fn == nil {
		return nil, errors.New("paramserver: CreatePerWorkerDataset: nil function")
	}
	n := len(c.s.workers)
	d := &PerWorkerDataset{c: c, ds: make([]dataset.Dataset, n), mu: make([]sync.Mutex, n), its: make([]dataset.Iterator, n),
		consumed: make([]int, n), ended: make([]bool, n)}
	for i := range n {
		ds, err := fn(dataset.InputContext{NumInputPipelines: n, InputPipelineID: i, NumReplicasInSync: 1})
		if err == nil && ds == nil {
			err = errors.New("nil dataset")
		}
		if err == nil {
			err = dataset.Err(ds)
		}
		if err != nil {
			return nil, fmt.Errorf("paramserver: the dataset of worker %d: %w", i, err)
		}
		d.ds[i] = ds
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil, ErrDone
	}
	c.datasets = append(c.datasets, d)
	return d, nil
}

func (d *PerWorkerDataset) element(ctx context.Context, worker int) (dataset.Element, error) {
	d.mu[worker].Lock()
	defer d.mu[worker].Unlock()
	if d.its[worker] == nil {
		it, err := d.ds[worker].Iterator(d.c.ctx)
		if err != nil {
			return nil, fmt.Errorf("the dataset of worker %d: %w", worker, err)
		}
		d.its[worker] = it
	}
	e, err := d.its[worker].Next(ctx)
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the dataset of worker %d ended after %d elements: %w", worker, d.consumed[worker], err)
	}
	if err != nil {
		return nil, fmt.Errorf("the dataset of worker %d: %w", worker, err)
	}
	d.consumed[worker]++
	return e, nil
}

// Consumed returns how many elements the dataset of each worker has given
// to steps so far, by worker index. An element goes to one step only: a
// step run again after its worker died is fed the element it took.
func (d *PerWorkerDataset) Consumed() []int {
	out := make([]int, len(d.consumed))
	for i := range d.consumed {
		d.mu[i].Lock()
		out[i] = d.consumed[i]
		d.mu[i].Unlock()
	}
	return out
}

// endedEverywhere reports whether d has ended on every worker; c.mu is held.
func (d *PerWorkerDataset) endedEverywhere() bool { return d.nEnded == len(d.ended) }

func (d *PerWorkerDataset) close() {
	for i := range d.its {
		d.mu[i].Lock()
		if d.its[i] != nil {
			d.its[i].Close()
		}
		d.mu[i].Unlock()
	}
}

// closure is one scheduled step.
type closure struct {
	id      int64
	fn      *Function
	in      Input
	elem    dataset.Element
	workers []int
	rv      *RemoteValue
}

// RemoteValue is the result of a scheduled step, available once the step
// has run.
type RemoteValue struct {
	done      chan struct{}
	out       map[string]*tf.Tensor
	err       error
	worker    int
	attempts  int
	applied   bool
	scheduled time.Time
	started   time.Time
	finished  time.Time
}

// Done returns a channel closed once the step has completed or failed.
func (rv *RemoteValue) Done() <-chan struct{} { return rv.done }

// Wait waits for the step and returns its error.
func (rv *RemoteValue) Wait(ctx context.Context) error {
	select {
	case <-rv.done:
		return rv.err
	case <-ctx.Done():
		return fmt.Errorf("paramserver: wait for a step: %w", ctx.Err())
	}
}

// Get waits for the step and returns its outputs, by name.
func (rv *RemoteValue) Get(ctx context.Context) (map[string]*tf.Tensor, error) {
	if err := rv.Wait(ctx); err != nil {
		return nil, err
	}
	return rv.out, nil
}

// RunInfo describes how a step ran.
type RunInfo struct {
	// Worker is the worker of the last attempt (-1 before the step ran).
	Worker int
	// Attempts counts the runs: more than one after worker failures.
	Attempts int
	// Applied reports whether the step's update was applied by the run
	// that completed (false for a step without updates, and for a rerun
	// whose update an earlier run had applied).
	Applied bool
	// Queued is the time from Schedule to the start of the first run,
	// input included; Ran the time from there to the end of the last run:
	// for a step that a failed worker sent back, its failed runs and its
	// wait to run again included.
	Queued, Ran time.Duration
}

// Info describes how the step ran; before the step is done it returns
// Worker -1.
func (rv *RemoteValue) Info() RunInfo {
	select {
	case <-rv.done:
	default:
		return RunInfo{Worker: -1}
	}
	info := RunInfo{Worker: rv.worker, Attempts: rv.attempts, Applied: rv.applied}
	if !rv.started.IsZero() {
		info.Queued, info.Ran = rv.started.Sub(rv.scheduled), rv.finished.Sub(rv.started)
	}
	return info
}

// Schedule queues one run of fn fed from in and returns its RemoteValue at
// once; a free worker runs it. A fixed input (Feed) is checked against fn's
// InputSpec here. Schedule fails after Done, after a ps task failed, for a
// function of another strategy, and with ErrEndOfData for a
// PerWorkerDataset that has ended on every worker.
func (c *Coordinator) Schedule(fn *Function, in Input) (*RemoteValue, error) {
	if fn == nil || fn.s != c.s {
		return nil, errors.New("paramserver: Schedule: the function was built by another strategy")
	}
	if in == nil {
		return nil, fmt.Errorf("paramserver: Schedule %s: nil input", fn.name)
	}
	if f, ok := in.(feedInput); ok {
		if _, err := fn.feeds(0, f, 0); err != nil {
			return nil, fmt.Errorf("paramserver: Schedule %s: %w", fn.name, err)
		}
	}
	if d, ok := in.(*PerWorkerDataset); ok && d.c != c {
		return nil, fmt.Errorf("paramserver: Schedule %s: the dataset belongs to another coordinator", fn.name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil, ErrDone
	}
	if c.fatal != nil {
		return nil, c.fatal
	}
	if d, ok := in.(*PerWorkerDataset); ok && d.endedEverywhere() {
		return nil, fmt.Errorf("paramserver: Schedule %s: %w", fn.name, ErrEndOfData)
	}
	rv := &RemoteValue{done: make(chan struct{}), worker: -1, scheduled: time.Now()}
	cl := &closure{id: c.s.nextClosure.Add(1), fn: fn, in: in, rv: rv}
	if c.pending == 0 {
		c.idle = make(chan struct{})
	}
	c.pending++
	c.stats.Scheduled++
	c.pushLocked(cl, false)
	return rv, nil
}

func (c *Coordinator) pushLocked(cl *closure, front bool) {
	if front {
		c.queue = append([]*closure{cl}, c.queue...)
	} else {
		c.queue = append(c.queue, cl)
	}
	close(c.wake)
	c.wake = make(chan struct{})
}

// Join waits until every step scheduled so far has completed or failed,
// and returns the first error of a step since the last Join (clearing it),
// or the failure of a ps task. The end of a PerWorkerDataset
// (ErrEndOfData) is not an error of Join. It gives up when ctx ends.
func (c *Coordinator) Join(ctx context.Context) error {
	c.mu.Lock()
	idle, pending := c.idle, c.pending
	c.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
		return fmt.Errorf("paramserver: Join: %d step(s) still pending: %w", pending, ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fatal != nil {
		return c.fatal
	}
	err := c.firstErr
	c.firstErr = nil
	return err
}

// Done waits for every scheduled step, as Join, then ends the coordinator:
// its loops stop, its sessions close, and Schedule fails with ErrDone. The
// strategy may then get a new coordinator.
func (c *Coordinator) Done(ctx context.Context) error {
	err := c.Join(ctx)
	c.shutdown(ctx)
	return err
}

func (c *Coordinator) isDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// shutdown stops the loops and fails whatever is still queued.
func (c *Coordinator) shutdown(ctx context.Context) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return
	}
	c.done = true
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, cl := range queued {
		c.resolve(cl, nil, fmt.Errorf("paramserver: step %s: %w before it ran", cl.fn.name, ErrDone))
	}
	c.cancel()
	stopped := make(chan struct{})
	go func() { c.loops.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		c.log.Warn("coordinator loops still running after shutdown", zap.Error(ctx.Err()))
	}
	c.mu.Lock()
	ds := c.datasets
	c.mu.Unlock()
	for _, d := range ds {
		d.close()
	}
}

// Stats returns what the coordinator has done so far.
func (c *Coordinator) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.PerWorker = append([]int(nil), c.stats.PerWorker...)
	st.Alive = append([]bool(nil), c.alive...)
	return st
}

// resolve completes a step.
func (c *Coordinator) resolve(cl *closure, out map[string]*tf.Tensor, err error) {
	rv := cl.rv
	rv.out, rv.err, rv.attempts = out, err, len(cl.workers)
	if len(cl.workers) > 0 {
		rv.worker = cl.workers[len(cl.workers)-1]
	}
	c.mu.Lock()
	c.pending--
	switch {
	case errors.Is(err, ErrEndOfData):
		c.stats.EndOfData++
	case err != nil:
		c.stats.Failed++
		if c.firstErr == nil {
			c.firstErr = err
		}
	default:
		c.stats.Succeeded++
		c.stats.PerWorker[rv.worker]++
		if cl.fn.updates && !rv.applied {
			c.stats.SkippedUpdates++
		}
	}
	if c.pending == 0 {
		close(c.idle)
	}
	c.mu.Unlock()
	close(rv.done)
}

// next takes the first step in the queue that worker w can run, or returns
// nil when the coordinator ends. A step on a PerWorkerDataset that has
// ended on w, and has not taken an element yet, is left to other workers.
func (c *Coordinator) next(w int) *closure {
	for {
		c.mu.Lock()
		if c.ctx.Err() != nil {
			c.mu.Unlock()
			return nil
		}
		for i, cl := range c.queue {
			if d, ok := cl.in.(*PerWorkerDataset); ok && cl.elem == nil && d.ended[w] {
				continue
			}
			c.queue = slices.Delete(c.queue, i, i+1)
			c.mu.Unlock()
			return cl
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake:
		case <-c.ctx.Done():
			return nil
		}
	}
}

func (c *Coordinator) setAlive(w int, alive bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.alive[w], c.lastErr[w] = alive, err
	up := false
	for _, a := range c.alive {
		up = up || a
	}
	if up {
		c.deadSince = time.Time{}
	} else if c.deadSince.IsZero() {
		c.deadSince = time.Now()
	}
}

// loop is worker w's: connect, take a step, run it; after a failure, probe
// until the worker answers again.
func (c *Coordinator) loop(w *workerGraph) {
	defer c.loops.Done()
	log := c.log.With(zap.Int("worker", w.index))
	backoff := c.cfg.probeMin
	connected, up := false, false
	for c.ctx.Err() == nil {
		if !up {
			if err := c.connect(w); err != nil {
				c.setAlive(w.index, false, err)
				log.Debug("worker not reachable", zap.Error(err), zap.Duration("retry_in", backoff))
				select {
				case <-time.After(backoff):
				case <-c.ctx.Done():
				}
				backoff = min(2*backoff, c.cfg.probeMax)
				continue
			}
			if connected {
				c.mu.Lock()
				c.stats.Reconnects++
				c.mu.Unlock()
				log.Info("worker is back")
			}
			connected, up, backoff = true, true, c.cfg.probeMin
			c.setAlive(w.index, true, nil)
		}
		cl := c.next(w.index)
		if cl == nil {
			return
		}
		up = c.run(w, cl, log)
	}
}

// connect checks that w answers within the probe timeout. A worker that
// restarted since it last answered has lost the parts of its graph it was
// given: they are given again at its next step.
func (c *Coordinator) connect(w *workerGraph) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.probeTimeout)
	defer cancel()
	_, err := w.sess.exec.Ping(ctx)
	if errors.Is(err, taskserver.ErrRestarted) {
		w.sess.Forget()
		_, err = w.sess.exec.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("worker %s at %s: %w", w.task, w.addr, err)
	}
	return nil
}

// run runs cl on w and reports whether w is still up.
func (c *Coordinator) run(w *workerGraph, cl *closure, log *zap.Logger) bool {
	cl.workers = append(cl.workers, w.index)
	stepErr := func(err error) *StepError {
		return &StepError{Function: cl.fn.name, Workers: append([]int(nil), cl.workers...), Err: err}
	}
	c.mu.Lock()
	fatal := c.fatal
	c.mu.Unlock()
	if fatal != nil {
		c.resolve(cl, nil, fatal)
		return true
	}
	if cl.elem == nil {
		e, err := cl.in.element(c.ctx, w.index)
		if d, ok := cl.in.(*PerWorkerDataset); ok && errors.Is(err, io.EOF) {
			cl.workers = cl.workers[:len(cl.workers)-1] // it did not run here
			c.endOfData(d, w.index, cl, log, err)
			return true
		}
		if err != nil {
			c.resolve(cl, nil, stepErr(fmt.Errorf("input: %w", err)))
			return true
		}
		cl.elem = e
	}
	feeds, err := cl.fn.feeds(w.index, cl.elem, cl.id)
	if err != nil {
		c.resolve(cl, nil, stepErr(err))
		return true
	}
	wf := cl.fn.workers[w.index]
	fetches := wf.fetches
	if cl.fn.updates {
		fetches = append(fetches[:len(fetches):len(fetches)], wf.applied)
	}
	if cl.rv.started.IsZero() {
		cl.rv.started = time.Now()
	}
	out, err := c.runWatched(w, feeds, fetches, wf.targets)
	cl.rv.finished = time.Now()
	if err == nil {
		res := make(map[string]*tf.Tensor, len(cl.fn.outNames))
		for i, name := range cl.fn.outNames {
			res[name] = out[i]
		}
		if cl.fn.updates {
			cl.rv.applied = tensorutil.Value(out[len(out)-1]).(bool)
		}
		c.resolve(cl, res, nil)
		return true
	}
	err = fmt.Errorf("run %s on worker %s: %w", cl.fn.name, w.task, err)
	return c.failed(w, cl, err, stepErr, log)
}

// failed handles the error of cl's run on w and reports whether w is still
// up: a ps task that failed fails every step; a worker that failed sends
// cl back to the queue; any other error is cl's own.
func (c *Coordinator) failed(w *workerGraph, cl *closure, err error, stepErr func(error) *StepError, log *zap.Logger) bool {
	if c.ctx.Err() != nil {
		c.resolve(cl, nil, stepErr(fmt.Errorf("the coordinator ended: %w", err)))
		return true
	}
	if k, cause := c.s.psFailure(c.ctx, err); k >= 0 {
		addr, _ := c.s.spec.TaskAddress(cluster.PS, c.s.psTasks[k].Index)
		pe := &PSFailureError{Task: c.s.psTasks[k], Addr: addr, Err: cause}
		log.Error("ps task failed", zap.Stringer("ps", pe.Task), zap.Error(cause))
		c.failAll(pe)
		c.resolve(cl, nil, pe)
		return true
	}
	if !workerFailure(err) {
		c.resolve(cl, nil, stepErr(err))
		return true
	}
	// Once back in the queue the step belongs to whichever worker takes it:
	// read what the log needs first.
	attempt := len(cl.workers)
	var se *StepError
	c.mu.Lock()
	c.stats.WorkerFailures++
	retry := attempt < c.cfg.maxAttempts && c.fatal == nil && !c.done
	if !retry {
		se = stepErr(err)
		se.Retried = attempt >= c.cfg.maxAttempts
	}
	if retry {
		c.stats.Retries++
		c.pushLocked(cl, true)
	}
	c.mu.Unlock()
	c.setAlive(w.index, false, err)
	log.Warn("worker failed; its step goes back to the queue", zap.String("function", cl.fn.name),
		zap.Int("attempt", attempt), zap.Bool("retried", retry), zap.Error(err))
	if !retry {
		c.resolve(cl, nil, se)
	}
	return false
}

// endOfData records that d has ended on worker w, as cl, a step that had
// not taken an element yet, found. cl goes back to the front of the queue
// for a worker whose dataset still has data; once d has ended on every
// worker, cl and every queued step waiting for an element of d resolve
// with ErrEndOfData instead.
func (c *Coordinator) endOfData(d *PerWorkerDataset, w int, cl *closure, log *zap.Logger, cause error) {
	c.mu.Lock()
	if !d.ended[w] {
		d.ended[w] = true
		d.nEnded++
	}
	all := d.endedEverywhere()
	var ended []*closure
	var failErr error
	switch {
	case c.fatal != nil:
		failErr = c.fatal
	case c.done:
		failErr = fmt.Errorf("paramserver: step %s: %w before it ran", cl.fn.name, ErrDone)
	case all:
		ended = append(ended, cl)
		kept := make([]*closure, 0, len(c.queue))
		for _, q := range c.queue {
			if q.in == Input(d) && q.elem == nil {
				ended = append(ended, q)
			} else {
				kept = append(kept, q)
			}
		}
		c.queue = kept
	default:
		c.pushLocked(cl, true)
	}
	c.mu.Unlock()
	log.Info("the worker's per-worker dataset ended; its steps go to the other workers",
		zap.Bool("ended_on_every_worker", all), zap.Error(cause))
	if failErr != nil {
		c.resolve(cl, nil, failErr)
	}
	for _, q := range ended {
		c.resolve(q, nil, fmt.Errorf("paramserver: step %s: %w", q.fn.name, ErrEndOfData))
	}
}

// runWatched runs a step on w, within the step timeout, and while it
// runs checks every heartbeat that w still answers: a worker that misses
// two in a row is taken for dead and its run abandoned (the call returns;
// if the step did get through, its guard keeps its update from being
// applied twice). The end of the coordinator ends the run too.
func (c *Coordinator) runWatched(w *workerGraph, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output,
	targets []*tf.Operation) ([]*tf.Tensor, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.stepTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	type result struct {
		out []*tf.Tensor
		err error
	}
	resc := make(chan result, 1)
	go func() {
		out, err := w.sess.Run(ctx, feeds, fetches, targets)
		resc <- result{out, err}
	}()
	tick := time.NewTicker(c.cfg.heartbeat)
	defer tick.Stop()
	misses := 0
	for {
		select {
		case r := <-resc:
			if r.err != nil && c.ctx.Err() == nil && (ctx.Err() != nil || time.Now().After(deadline)) {
				// The step's deadline ended it, here or on the worker, which
				// has it too.
				return nil, fmt.Errorf("%w (%v)", errStepTimeout(c.s.cfg.stepTimeout), r.err)
			}
			return r.out, r.err
		case <-tick.C:
			pctx, pcancel := context.WithTimeout(c.ctx, c.cfg.probeTimeout)
			_, perr := w.sess.exec.Ping(pctx)
			pcancel()
			if perr == nil || c.ctx.Err() != nil {
				misses = 0
				continue
			}
			if misses++; misses < 2 {
				continue
			}
			return nil, fmt.Errorf("%w: the worker at %s stopped answering while running the step: %w", errWorkerLost, w.addr, perr)
		}
	}
}

// errWorkerLost is wrapped by the error of a run whose worker stopped
// answering or ran past the step timeout.
var errWorkerLost = errors.New("worker lost")

func errStepTimeout(d time.Duration) error {
	return fmt.Errorf("%w: the step ran past the step timeout (%v)", errWorkerLost, d)
}

// workerFailure reports whether err is what a worker that died, restarted
// or hung makes a run fail with: its server did not answer, answered as
// a new server, or the run outlived the step timeout or the heartbeats —
// or a ps task that answers the chief did not answer the worker.
func workerFailure(err error) bool {
	if errors.Is(err, errWorkerLost) {
		return true
	}
	return errors.Is(err, taskserver.ErrUnavailable) || errors.Is(err, taskserver.ErrRestarted)
}

// failAll records a ps failure and fails every queued step with it.
func (c *Coordinator) failAll(err error) {
	c.mu.Lock()
	if c.fatal == nil {
		c.fatal = err
	}
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, cl := range queued {
		c.resolve(cl, nil, err)
	}
}

// watchdog fails the queued steps when no worker has been up for
// WithWorkerWaitTimeout.
func (c *Coordinator) watchdog() {
	defer c.loops.Done()
	tick := time.NewTicker(min(c.cfg.workerWait/10, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		c.mu.Lock()
		if c.deadSince.IsZero() || len(c.queue) == 0 || time.Since(c.deadSince) < c.cfg.workerWait {
			c.mu.Unlock()
			continue
		}
		e := &NoWorkerError{Workers: map[cluster.Task]error{}, Addrs: map[cluster.Task]string{}, Waited: time.Since(c.deadSince)}
		for i, w := range c.s.workers {
			e.Workers[w.task], e.Addrs[w.task] = c.lastErr[i], w.addr
		}
		queued := c.queue
		c.queue = nil
		c.deadSince = time.Now()
		c.mu.Unlock()
		c.log.Error("no worker is up; failing the queued steps", zap.Int("steps", len(queued)), zap.Error(e))
		for _, cl := range queued {
			c.resolve(cl, nil, e)
		}
	}
}
