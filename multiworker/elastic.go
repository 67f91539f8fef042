package multiworker

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/timeline"
)

// ErrMembershipChanged is StepDone's error when the job's membership
// changes at this step boundary: a worker joins or leaves. The train
// function of RunElastic returns it, and RunElastic calls train again on
// the next membership.
var ErrMembershipChanged = errors.New("multiworker: the job's membership changes at this step boundary")

// maxUnexplained bounds the failed memberships in a row from which no
// worker left: a failure that re-forming does not cure is train's own.
const maxUnexplained = 3

// elasticStartup is the default start-up timeout of a membership's group:
// its members listen before the membership forms, so only a member that
// died since keeps a group from forming.
const elasticStartup = 10 * time.Second

// snapshot is a worker's state after Steps steps: every Saveable's value,
// in the order of State().Saveables(), and the program's progress then.
type snapshot struct {
	steps    int64
	names    []string
	values   []*tf.Tensor
	progress []byte
}

// elasticRun is a Strategy's part in an elastic job.
type elasticRun struct {
	member   *elastic.Member
	mb       elastic.Membership
	snap     snapshot
	reads    []tf.Output // of every Saveable, built at the first StepDone
	names    []string    // of the Saveables that reads reads, in the same order (non-nil once built)
	progress []byte      // what SetProgress set, for the next StepDone
	resumed  bool        // Resume has run on this membership
}

// RunElastic trains on every membership of an elastic job in turn. For
// each, it forms a group of the members (listening on host, port chosen),
// makes a Strategy of it with opts, and calls train, which builds the
// model, calls Resume for the step to go on from, and calls StepDone after
// every step. When a member dies (a step fails with ErrCannotContinue) or
// the membership changes (ErrMembershipChanged), RunElastic closes the
// strategy and calls train again on the next membership, in the same
// process: the members take the state of the last step any of them
// completed from one that holds it. It returns nil once train does (and
// tells the rendezvous the job is done), nil after a graceful leave
// (m.LeaveSoon), nil when the job finishes while this worker waits as a
// standby (train then never finished here), or train's other errors.
//
// The groups run mutual TLS as New's do (WithTLS, RequireTLS, or the
// files the environment names); each worker's certificate must then name
// it as it joined the job (m.Name(), e.g. worker:3), since its peers
// check that it does.
//
// The timeline and the metrics last the whole run: those of WithTimeline
// and WithMonitoring, or, as New sets them up from the environment
// (tfdist launch --timeline and --metrics), a trace written when
// RunElastic returns and metrics served until then.
func RunElastic(ctx context.Context, m *elastic.Member, host string, train func(ctx context.Context, s *Strategy) error, opts ...Option) error {
	c, err := checkElastic(opts)
	if err != nil {
		return errors.Join(err, m.Close())
	}
	obs, err := newObserver(c, m.Name())
	if err != nil {
		return errors.Join(err, m.Close())
	}
	if c.tls, err = c.elasticTLS(m.Name()); err != nil {
		return errors.Join(err, obs.close(), m.Close())
	}
	if c.tls != nil {
		opts = append(opts, WithTLS(c.tls)) // read once, for every membership
	}
	if obs.rec != nil {
		c.timeline = obs.rec
		opts = append(opts, WithTimeline(obs.rec))
	}
	if obs.m != nil {
		c.metrics = obs.m
		opts = append(opts, WithMonitoring(obs.m))
	}
	err = runElastic(ctx, c, m, host, train, opts)
	return errors.Join(err, obs.close())
}

// runElastic is RunElastic's loop over the memberships.
func runElastic(ctx context.Context, c config, m *elastic.Member, host string, train func(ctx context.Context, s *Strategy) error, opts []Option) error {
	var snap snapshot
	var failed error // of the last membership, if it broke
	unexplained := 0
	var closing sync.WaitGroup // the strategies of broken memberships
	defer closing.Wait()
	for {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return errors.Join(fmt.Errorf("multiworker: listen for the next group: %w", err), m.Close())
		}
		formed := c.timeline.Begin(timeline.Membership, "membership")
		mb, err := m.Next(ctx, elastic.Report{Step: snap.steps, Addr: ln.Addr().String()})
		if errors.Is(err, elastic.ErrJobFinished) { // while this worker waited as a standby
			return errors.Join(ln.Close(), m.Close())
		}
		if err != nil {
			return errors.Join(err, ln.Close(), m.Close())
		}
		if failed == nil || len(mb.Left) > 0 {
			unexplained = 0
		} else if unexplained++; unexplained >= maxUnexplained {
			return errors.Join(fmt.Errorf("multiworker: %d memberships in a row broke while no worker left: %w", unexplained, failed), m.Close())
		}
		failed = nil
		observeMembership(c, mb, formed)
		err = trainOn(ctx, mb, ln, &snap, m, train, opts, &closing)
		switch {
		case err == nil:
			return m.Leave(true)
		case errors.Is(err, ErrMembershipChanged) && m.Leaving():
			return m.Leave(false)
		case errors.Is(err, ErrMembershipChanged):
		case errors.Is(err, strategy.ErrCannotContinue):
			failed = err
		default:
			return errors.Join(err, m.Close())
		}
	}
}

// observeMembership records mb in the metrics and the timeline, if any.
func observeMembership(c config, mb elastic.Membership, formed func(args any)) {
	if c.metrics != nil {
		c.metrics.Workers.Set(float64(len(mb.Members)))
		c.metrics.Memberships.Inc()
	}
	left := make([]string, len(mb.Left))
	for i, d := range mb.Left {
		left[i] = d.String()
	}
	formed(map[string]any{"epoch": mb.Epoch, "workers": len(mb.Members), "rank": mb.Rank, "step": mb.Step, "joined": mb.Joined, "left": left})
}

// checkElastic refuses the options an elastic job cannot honour, and
// returns the others.
func checkElastic(opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.comm != Auto && c.comm != Engine:
		return c, fmt.Errorf("multiworker: RunElastic: WithCommunication(%v): an elastic job runs on tfdist's engine (Auto or Engine)", c.comm)
	case c.localSGD != nil && c.localSGD.Overlap > 0:
		return c, fmt.Errorf("multiworker: RunElastic: WithLocalSGD with Overlap %d: an elastic job synchronises between two steps (Overlap 0)", c.localSGD.Overlap)
	case c.resolver != nil:
		return c, errors.New("multiworker: RunElastic: WithResolver: an elastic job's membership comes from its rendezvous, not a cluster spec")
	}
	return c, nil
}

// elasticTLS returns the TLS configuration of the job's groups (nil for
// plaintext), after checking that this worker's certificate names it as
// it joined the job, name: its peers accept it only then.
func (c config) elasticTLS(name string) (*tls.Config, error) {
	cfg, err := c.tlsConfig(logging.OrNop(c.log))
	if cfg == nil || err != nil {
		return nil, err
	}
	id, err := mtls.ConfigIdentity(cfg)
	switch {
	case err != nil:
		return nil, fmt.Errorf("multiworker: RunElastic: this worker's certificate: %w", err)
	case id.Task.String() != name:
		return nil, fmt.Errorf("multiworker: RunElastic: this worker joined the job as %q but its certificate names %s: name it as its certificate does (%s=%s)",
			name, id, elastic.EnvName, id.Task)
	}
	return cfg, nil
}

// trainOn runs train on the strategy of membership mb, whose group
// listens on ln, and keeps its last state in snap.
func trainOn(ctx context.Context, mb elastic.Membership, ln net.Listener, snap *snapshot, m *elastic.Member,
	train func(ctx context.Context, s *Strategy) error, opts []Option, closing *sync.WaitGroup) error {
	s, err := newMember(ctx, mb, ln, opts)
	if errors.Is(err, ErrArithmeticMismatch) {
		return err // this worker leaves the job
	}
	if err != nil {
		return errors.Join(err, strategy.ErrCannotContinue) // a member failed to come up: form another
	}
	s.elastic = &elasticRun{member: m, mb: mb, snap: *snap}
	stopWatching := s.abortOnLoss(m, mb.Epoch)
	err = train(ctx, s)
	stopWatching()
	*snap = s.elastic.snap
	if errors.Is(err, strategy.ErrCannotContinue) {
		// A broken group's close waits for connections to a dead or
		// stopped peer to drain: the next group need not.
		closing.Add(1)
		go func() {
			defer closing.Done()
			s.log.Debug("closed the strategy of a broken membership", zap.Error(err), zap.NamedError("close", s.Close()))
		}()
		return err
	}
	cerr := s.Close()
	if err != nil {
		s.log.Debug("closed the strategy of a membership that ended", zap.Error(err), zap.NamedError("close", cerr))
		return err
	}
	return cerr
}

// abortOnLoss aborts s's group when the rendezvous sees a member of epoch
// go (its heartbeats stopped, say), so that a step waiting for it fails
// now, not at the collective timeout, until stop is called.
func (s *Strategy) abortOnLoss(m *elastic.Member, epoch uint32) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case d := <-m.Lost():
				if d.Epoch == epoch && s.group != nil {
					s.log.Warn("the rendezvous saw a member go: aborting the group", zap.Stringer("departure", d))
					s.group.Abort(fmt.Errorf("the rendezvous saw %s", d))
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}

// newMember makes the Strategy of membership mb, its group listening on
// ln (a membership of one has no group, and closes ln).
func newMember(ctx context.Context, mb elastic.Membership, ln net.Listener, opts []Option) (*Strategy, error) {
	if len(mb.Members) == 1 {
		_ = ln.Close()
		ln = nil
	}
	addrs := make([]string, len(mb.Members))
	names := make([]string, len(mb.Members))
	for i, m := range mb.Members {
		addrs[i], names[i] = m.Addr, m.Name
	}
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: addrs})
	if err == nil {
		var r cluster.Resolver
		if r, err = cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Worker, Index: mb.Rank}); err == nil {
			opts = append(append([]Option{WithStartupTimeout(elasticStartup)}, opts...), WithResolver(r), func(c *config) {
				c.listener, c.epoch, c.names, c.holder = ln, mb.Epoch, names, mb.Holder
			})
			var s *Strategy
			if s, err = New(ctx, opts...); err == nil {
				return s, nil
			}
		}
	}
	if ln != nil {
		_ = ln.Close()
	}
	return nil, fmt.Errorf("multiworker: membership %d: %w", mb.Epoch, err)
}

// Resume gives every worker of an elastic job the state of the last step
// any of them completed, and returns that step's count: the step to go on
// from (0 in a new job, which keeps its initial values). Every worker
// calls it once, after building its model and steps and before its first
// step.
func (s *Strategy) Resume(ctx context.Context) (int64, error) {
	el := s.elastic
	if el == nil {
		return 0, errors.New("multiworker: Resume: the strategy is not elastic (RunElastic makes one)")
	}
	if el.resumed {
		return 0, errors.New("multiworker: Resume: called twice on one membership: call it once, before the first step")
	}
	el.resumed = true
	saveables := s.State().Saveables()
	if err := s.sameModel(ctx, saveables); err != nil {
		return 0, err
	}
	if el.mb.Step <= 0 {
		el.snap, el.progress = snapshot{}, nil
		return 0, nil
	}
	values, err := s.receiveState(ctx, saveables)
	if err != nil {
		return 0, err
	}
	progress, err := s.receiveProgress(ctx)
	if err != nil {
		return 0, err
	}
	if err := s.writeState(ctx, saveables, values); err != nil {
		return 0, err
	}
	if l := s.localSGD; l != nil { // a joiner's count, as the others'
		n, err := l.steps(ctx, s)
		if err != nil {
			return 0, fmt.Errorf("multiworker: Resume: %w", err)
		}
		l.trained.Store(n)
	}
	el.snap = snapshot{steps: el.mb.Step, names: names(saveables), values: values, progress: progress}
	el.progress = progress
	return el.mb.Step, nil
}

// SetProgress records p as the program's progress, beyond its variables:
// its place in its data, its running totals, whatever it needs to go on
// from a step as if it had never stopped. The next StepDone keeps p with
// the state of its step, and after a change of members Resume gives every
// worker the holder's, which Progress returns. Call it after a step and
// before its StepDone; until called again, every StepDone keeps p.
func (s *Strategy) SetProgress(p []byte) {
	if s.elastic != nil {
		s.elastic.progress = bytes.Clone(p)
	}
}

// Progress returns the progress kept with the state Resume gave: what the
// holder of that state had set with SetProgress, or nil (a new job, or a
// program that never set one).
func (s *Strategy) Progress() []byte {
	if s.elastic == nil {
		return nil
	}
	return bytes.Clone(s.elastic.snap.progress)
}

// Elastic reports whether s is a membership's strategy of an elastic job
// (RunElastic made it): one whose programs call Resume and StepDone.
func (s *Strategy) Elastic() bool { return s.elastic != nil }

// ErrArithmeticMismatch is New's error, under WithDeterministic, on a
// worker of an elastic job whose kernels may round otherwise than those
// of the member holding the job's state (tfdist's check of TensorFlow's
// version, intra-op threads, oneDNN and the CPU's vector extensions):
// RunElastic leaves the job, and the others re-form without it.
var ErrArithmeticMismatch = errors.New("multiworker: this worker's kernels may round otherwise than the job's")

// ErrModelMismatch is Resume's error on a worker whose model differs
// from the one of the member holding the job's state.
var ErrModelMismatch = errors.New("multiworker: this worker's model differs from the job's")

// sameModel checks that every member built the model of the holder: the
// same variables' names, dtypes and shapes. The member that differs gets
// ErrModelMismatch (and RunElastic leaves the job); the others re-form
// without it (ErrMembershipChanged).
func (s *Strategy) sameModel(ctx context.Context, saveables []strategy.Saveable) error {
	if s.group == nil {
		return nil
	}
	h := fnv.New64a()
	for _, sv := range saveables {
		fmt.Fprintf(h, "%s %d %v;", sv.Name, sv.DType, sv.Shape)
	}
	all, err := s.group.AllGather(ctx, "tfdist_elastic_model", collective.Int64, h.Sum(nil))
	if err != nil {
		return fmt.Errorf("multiworker: Resume: compare the models: %w", errors.Join(err, strategy.ErrCannotContinue))
	}
	holder := s.elastic.mb.Holder
	var odd []int
	for i, fp := range all {
		if !bytes.Equal(fp, all[holder]) {
			odd = append(odd, i)
		}
	}
	switch {
	case len(odd) == 0:
		return nil
	case !bytes.Equal(all[s.WorkerID()], all[holder]):
		return fmt.Errorf("%w: its variables' names, dtypes or shapes differ from those of worker %d, which holds the job's state", ErrModelMismatch, holder)
	}
	s.log.Warn("workers built another model and leave the job", zap.Ints("workers", odd))
	return fmt.Errorf("workers %v built another model: %w", odd, ErrMembershipChanged)
}

func names(saveables []strategy.Saveable) []string {
	out := make([]string, len(saveables))
	for i, sv := range saveables {
		out[i] = sv.Name
	}
	return out
}

// receiveState broadcasts the holder's snapshot to every member.
func (s *Strategy) receiveState(ctx context.Context, saveables []strategy.Saveable) ([]*tf.Tensor, error) {
	el := s.elastic
	holder := el.mb.Rank == el.mb.Holder
	if holder && (el.snap.steps != el.mb.Step || len(el.snap.names) != len(saveables)) {
		return nil, fmt.Errorf("multiworker: Resume: this worker holds the state of step %d, of %d variables; the membership expects step %d, of %d",
			el.snap.steps, len(el.snap.names), el.mb.Step, len(saveables))
	}
	if s.group == nil { // a membership of one: its own state
		return el.snap.values, nil
	}
	values := make([]*tf.Tensor, len(saveables))
	for i, sv := range saveables {
		dt, ok := engineops.CollectiveDType(sv.DType)
		if !ok {
			return nil, fmt.Errorf("multiworker: Resume: variable %s has dtype %v, which the collective engine cannot broadcast", sv.Name, sv.DType)
		}
		var buf bytes.Buffer
		if holder {
			if el.snap.names[i] != sv.Name {
				return nil, fmt.Errorf("multiworker: Resume: variable %d is %s here and %s in the snapshot: build the same model on every membership", i, sv.Name, el.snap.names[i])
			}
			if _, err := el.snap.values[i].WriteContentsTo(&buf); err != nil {
				return nil, err
			}
		} else {
			buf.Write(make([]byte, dt.Size()*int(tensorutil.NumElements(sv.Shape))))
		}
		data := buf.Bytes()
		if err := s.group.Broadcast(ctx, "tfdist_elastic_state/"+sv.Name, el.mb.Holder, dt, data, collective.Shape(sv.Shape...)); err != nil {
			return nil, fmt.Errorf("multiworker: Resume: take %s from worker %d: %w", sv.Name, el.mb.Holder, errors.Join(err, strategy.ErrCannotContinue))
		}
		t, err := tf.ReadTensor(sv.DType, sv.Shape, bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("multiworker: Resume: %s: %w", sv.Name, err)
		}
		values[i] = t
	}
	return values, nil
}

// receiveProgress broadcasts the holder's progress to every member: its
// length, then its bytes (padded to whole int64s, the engine's unit).
func (s *Strategy) receiveProgress(ctx context.Context) ([]byte, error) {
	el := s.elastic
	if s.group == nil {
		return el.snap.progress, nil
	}
	holder := el.mb.Rank == el.mb.Holder
	size := make([]byte, 8)
	if holder {
		binary.LittleEndian.PutUint64(size, uint64(len(el.snap.progress)))
	}
	if err := s.group.Broadcast(ctx, "tfdist_elastic_progress_size", el.mb.Holder, collective.Int64, size); err != nil {
		return nil, fmt.Errorf("multiworker: Resume: take the progress from worker %d: %w", el.mb.Holder, errors.Join(err, strategy.ErrCannotContinue))
	}
	n := binary.LittleEndian.Uint64(size)
	if n == 0 {
		return nil, nil
	}
	data := make([]byte, (n+7)/8*8)
	if holder {
		copy(data, el.snap.progress)
	}
	if err := s.group.Broadcast(ctx, "tfdist_elastic_progress", el.mb.Holder, collective.Int64, data); err != nil {
		return nil, fmt.Errorf("multiworker: Resume: take the progress from worker %d: %w", el.mb.Holder, errors.Join(err, strategy.ErrCannotContinue))
	}
	return data[:n], nil
}

// writeState assigns values to the variables.
func (s *Strategy) writeState(ctx context.Context, saveables []strategy.Saveable, values []*tf.Tensor) error {
	if len(saveables) == 0 {
		return nil
	}
	feeds := map[tf.Output]*tf.Tensor{}
	var targets []*tf.Operation
	err := s.State().Extend("elastic_resume", func(sc *op.Scope) error {
		for i, sv := range saveables {
			sl := sv.Slices[0]
			ph := op.Placeholder(sc.WithDevice(sl.Device).SubScope("value"), sv.DType)
			ops, err := sl.Write(sc.WithDevice(sl.Device).SubScope("write"), ph)
			if err != nil {
				return fmt.Errorf("variable %s: %w", sv.Name, err)
			}
			feeds[ph] = values[i]
			targets = append(targets, ops...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("multiworker: Resume: %w", err)
	}
	_, err = s.State().Run(ctx, feeds, nil, targets, func() {
		for _, sv := range saveables {
			if sv.Slices[0].Restored != nil {
				sv.Slices[0].Restored()
			}
		}
	})
	if err != nil {
		return fmt.Errorf("multiworker: Resume: write the state: %w", err)
	}
	return nil
}

// StepDone marks the end of a step of an elastic job, or of any point the
// program can go on from (train's Fit also marks each epoch's end): it
// keeps the state in memory with the progress SetProgress set (the state
// a re-formed group takes if this worker holds the newest), then agrees
// with the other members whether the membership changes here, and returns
// ErrMembershipChanged if it does. Resume counts the StepDone calls.
//
// Under WithLocalSGD the workers meet only to synchronise, so they agree
// only after a step that synchronised: a change of members waits for the
// next synchronisation, and a worker lost between two fails the survivors
// there. The group then re-formed goes on from the last step every
// survivor completed, with the holder's state: its parameters and
// optimizer slots replace the other survivors' own since the last
// synchronisation.
func (s *Strategy) StepDone(ctx context.Context) error {
	el := s.elastic
	if el == nil {
		return errors.New("multiworker: StepDone: the strategy is not elastic (RunElastic makes one)")
	}
	if err := s.snapshot(ctx); err != nil {
		return err
	}
	if el.mb.Until > 0 && el.snap.steps >= el.mb.Until { // a replay's membership ends here
		return ErrMembershipChanged
	}
	if s.localSGD != nil && !s.localSGD.meeting() {
		return nil
	}
	change, err := el.member.Agree(ctx, s.group, "tfdist_elastic_agree")
	if err != nil {
		return fmt.Errorf("multiworker: StepDone: agree on the membership: %w", errors.Join(err, strategy.ErrCannotContinue))
	}
	if change {
		return ErrMembershipChanged
	}
	return nil
}

// snapshot reads every Saveable into memory.
func (s *Strategy) snapshot(ctx context.Context) error {
	el := s.elastic
	if el.names == nil {
		saveables := s.State().Saveables()
		err := s.State().Extend("elastic_snapshot", func(sc *op.Scope) error {
			for _, sv := range saveables {
				out, err := sv.Slices[0].Read(sc.WithDevice(sv.Slices[0].Device))
				if err != nil {
					return fmt.Errorf("variable %s: %w", sv.Name, err)
				}
				el.reads = append(el.reads, out)
			}
			return nil
		})
		if err != nil {
			el.reads = nil
			return fmt.Errorf("multiworker: StepDone: %w", err)
		}
		el.names = names(saveables)
	}
	var values []*tf.Tensor
	if len(el.reads) > 0 { // a program may step without variables
		var err error
		if values, err = s.State().Run(ctx, nil, el.reads, nil, nil); err != nil {
			return fmt.Errorf("multiworker: StepDone: keep the state: %w", err)
		}
	}
	el.snap = snapshot{steps: el.snap.steps + 1, names: el.names, values: values, progress: el.progress}
	return nil
}
