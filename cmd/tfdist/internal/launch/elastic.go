package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/mtls"
)

// WithElastic makes the job elastic, between min and max workers: the
// launcher runs a rendezvous (package elastic) that the workers join
// (elastic.JoinFromEnv), replaces a worker that fails (up to
// WithTaskRestarts times each), and adds or removes one on Scale. The
// workers get no TF_CONFIG; WithWorkers is how many start.
func WithElastic(min, max int) Option {
	return func(l *Launcher) { l.elastic, l.minWorkers, l.maxWorkers = true, min, max }
}

// WithElasticSizes allows an elastic job's memberships these sizes only
// (elastic.WithSizes), say 1, 2 and 4 for a program that trains with
// WithDeterministic(4).
func WithElasticSizes(sizes ...int) Option {
	return func(l *Launcher) { l.sizes = slices.Clone(sizes) }
}

// WithMembershipLog has an elastic job's rendezvous write its membership
// log (elastic.WithLog) to w.
func WithMembershipLog(w io.Writer) Option { return func(l *Launcher) { l.membershipLog = w } }

// WithReplay makes an elastic job replay a membership log without its
// failures (elastic.WithReplay): it starts every worker the log names,
// worker:0 to worker:N-1, at once, whatever WithWorkers and WithElastic's
// bounds say, and does not scale.
func WithReplay(entries []elastic.LogEntry) Option {
	return func(l *Launcher) { l.replay = slices.Clone(entries) }
}

// replayWorkers is the number of workers a replay names, which must be
// worker:0 to worker:N-1.
func replayWorkers(entries []elastic.LogEntry) (int, error) {
	seen := map[int]bool{}
	for _, e := range entries {
		for _, name := range e.Members {
			t, err := cluster.ParseTask(name)
			if err != nil || t.Type != cluster.Worker {
				return 0, fmt.Errorf("replay: membership %d names %q, expected worker:N as launch names its workers", e.Epoch, name)
			}
			seen[t.Index] = true
		}
	}
	for i := range len(seen) {
		if !seen[i] {
			return 0, fmt.Errorf("replay: the log names %d workers but not worker:%d: expected worker:0 to worker:%d, as launch names them", len(seen), i, len(seen)-1)
		}
	}
	return len(seen), nil
}

// Scale asks an elastic job for delta more workers (or fewer, negative):
// one more starts, up to the maximum; one fewer is the newest worker,
// sent SIGTERM to leave at its next step boundary, down to the minimum.
func (l *Launcher) Scale(delta int) {
	select {
	case l.scales <- delta:
	default:
	}
}

// checkElastic refuses the options an elastic job cannot take. A replay
// runs every worker its log names, whatever the worker counts say: it
// sets them.
func (l *Launcher) checkElastic() error {
	switch {
	case !l.elastic && (l.replay != nil || l.membershipLog != nil):
		return errors.New("a membership log and a replay are an elastic job's (--elastic)")
	case !l.elastic:
		return nil
	}
	if l.replay != nil {
		n, err := replayWorkers(l.replay)
		if err != nil {
			return err
		}
		l.workers, l.minWorkers, l.maxWorkers = n, n, n
	}
	switch {
	case l.minWorkers < 1 || l.maxWorkers < l.minWorkers:
		return fmt.Errorf("elastic: min workers %d, max workers %d: expected 1 <= min <= max", l.minWorkers, l.maxWorkers)
	case slices.ContainsFunc(l.sizes, func(n int) bool { return n < l.minWorkers || n > l.maxWorkers }) || !slices.IsSorted(l.sizes):
		return fmt.Errorf("elastic: sizes %v: expected ascending worker counts between the min and max workers, %d and %d", l.sizes, l.minWorkers, l.maxWorkers)
	case l.workers < l.minWorkers || l.workers > l.maxWorkers:
		return fmt.Errorf("workers: %d, expected between the min and max workers, %d and %d", l.workers, l.minWorkers, l.maxWorkers)
	case l.chief || l.ps > 0 || l.eval:
		return errors.New("elastic: an elastic job has workers only (no --chief, --ps or --evaluator)")
	case l.maxRestarts > 0:
		return errors.New("elastic: --max-restarts restarts a whole cluster; an elastic job replaces a failed worker alone (--task-restarts)")
	case l.basePort > 0:
		return errors.New("elastic: --base-port does not apply to an elastic job: its workers choose their ports")
	}
	return nil
}

// elasticEnv is the environment that places t in the elastic job.
func (l *Launcher) elasticEnv(t cluster.Task) []string {
	if !l.elastic {
		return nil
	}
	return []string{elastic.EnvRendezvous + "=" + l.rendezvous, elastic.EnvJob + "=" + l.job, elastic.EnvName + "=" + t.String()}
}

// attemptElastic runs the elastic job: the rendezvous, and its workers.
func (l *Launcher) attemptElastic(ctx context.Context) error {
	opts, err := l.rendezvousOptions()
	if err != nil {
		return err
	}
	ln, err := l.listenRendezvous()
	if err != nil {
		return fmt.Errorf("elastic: the rendezvous: %w", err)
	}
	srv, err := elastic.NewServer(ln, opts...)
	if err != nil {
		return err
	}
	l.rendezvous = srv.Addr()
	sctx, stopServing := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx) }()
	r := l.newRun(0, cluster.ClusterSpec{}, l.maxWorkers)
	r.served = served
	defer func() {
		r.end()
		if stopServing(); r.served != nil {
			<-served
		}
	}()
	l.log.Info("starting an elastic job", zap.String("job", l.job), zap.String("rendezvous", l.rendezvous),
		zap.Int("workers", l.workers), zap.Int("min", l.minWorkers), zap.Int("max", l.maxWorkers))
	for i := range l.workers {
		if err := r.add(i); err != nil {
			return err
		}
	}
	if err := r.wait(ctx); err != nil || r.finished {
		return err
	}
	return r.lastFailure
}

// rendezvousOptions are the options of the job's rendezvous.
func (l *Launcher) rendezvousOptions() ([]elastic.Option, error) {
	opts := []elastic.Option{elastic.WithJob(l.job), elastic.WithMembers(l.minWorkers, l.maxWorkers),
		elastic.WithSizes(l.sizes...), elastic.WithLogger(l.log.Named("rendezvous"))}
	if l.tls {
		cfg, err := mtls.LoadConfig(l.tlsFiles[mtls.RendezvousTask], mtls.WithLogger(l.log.Named("rendezvous")))
		if err != nil {
			return nil, fmt.Errorf("TLS certificate of the rendezvous: %w", err)
		}
		opts = append(opts, elastic.WithTLS(cfg))
	}
	if l.replay != nil {
		opts = append(opts, elastic.WithReplay(l.replay))
	}
	if l.membershipLog != nil {
		opts = append(opts, elastic.WithLog(l.membershipLog))
	}
	return opts, nil
}

// add starts worker i of an elastic job.
func (r *clusterRun) add(i int) error {
	t := cluster.Task{Type: cluster.Worker, Index: i}
	p, err := r.l.start(r.spec, t, i, 0, r.out, r.exits)
	if err != nil {
		return fmt.Errorf("start %s: %w", t, err)
	}
	r.procs = append(r.procs, p)
	r.restarts = append(r.restarts, 0)
	r.pending = append(r.pending, nil)
	r.running++
	return nil
}

// rendezvousEnded handles the end of an elastic job's rendezvous: the job
// finished (its workers exit on their own) or stopped.
func (r *clusterRun) rendezvousEnded(err error) {
	r.served = nil
	if err == nil {
		r.finished = true
		r.cancelRestarts()
		return
	}
	r.l.log.Error("the elastic job stopped", zap.Error(err))
	r.stop(err, nil, syscall.SIGTERM)
}

// elasticExited replaces a worker of an elastic job that failed, after its
// backoff delay and up to its restarts; the job goes on without it
// meanwhile, or for good.
func (r *clusterRun) elasticExited(ev exitEvent) (error, bool) {
	p := ev.p
	if ev.state.Success() || r.finished {
		return nil, false
	}
	n := r.restarts[p.index]
	if n >= r.l.taskRestarts {
		r.lastFailure = newTaskError(p.task, p.start, ev.state, fmt.Sprintf(
			"and is not replaced again: the limit is %d restart%s per task (--task-restarts)", n, plural(n)))
		r.l.log.Warn("a worker of the elastic job failed and is not replaced", zap.Stringer("task", p.task), zap.Stringer("status", ev.state))
		return nil, false
	}
	r.restarts[p.index]++
	delay := r.l.restartDelay(n + 1)
	signalGroup(p.pgid, syscall.SIGKILL)
	i := p.index
	r.pending[i] = time.AfterFunc(delay, func() { r.due <- i })
	r.l.log.Warn("a worker of the elastic job failed; replacing it", zap.Stringer("task", p.task),
		zap.Stringer("status", ev.state), zap.Int("restart", n+1), zap.Duration("delay", delay))
	return nil, false
}

// scale starts a worker (delta > 0) or sends the newest one SIGTERM.
func (r *clusterRun) scale(delta int) {
	live := 0
	newest := -1
	for i, p := range r.procs {
		if !p.done || r.pending[i] != nil {
			live++
			if !p.done && !p.leaving {
				newest = i
			}
		}
	}
	switch {
	case r.stopping || r.finished:
	case r.l.replay != nil:
		r.l.log.Warn("not scaling the elastic job: it replays a membership log", zap.Int("delta", delta))
	case delta > 0 && live < r.l.maxWorkers:
		if err := r.add(len(r.procs)); err != nil {
			r.l.log.Error("could not add a worker", zap.Error(err))
		}
	case delta < 0 && live > r.l.minWorkers && newest >= 0:
		r.procs[newest].leaving = true
		r.restarts[newest] = r.l.taskRestarts // it leaves for good
		signalGroup(r.procs[newest].pgid, syscall.SIGTERM)
		r.l.log.Info("asked a worker to leave", zap.Stringer("task", r.procs[newest].task))
	default:
		r.l.log.Warn("not scaling the elastic job", zap.Int("delta", delta), zap.Int("workers", live),
			zap.Int("min", r.l.minWorkers), zap.Int("max", r.l.maxWorkers))
	}
}
