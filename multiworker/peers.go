package multiworker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/probe"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

// peerState is what a check of a peer found wrong with it.
type peerState int

const (
	peerFinished     peerState = iota + 1 // it closed its strategy: its program has finished
	peerUnresponsive                      // it accepts connections but does not answer
	peerDead                              // it does not accept connections, and did not say it finished
	peerNotUp                             // at start-up: it does not accept connections yet
)

// peerReport is the state of one peer.
type peerReport struct {
	worker int
	task   cluster.Task
	addr   string
	state  peerState
}

func (r peerReport) String() string {
	who := fmt.Sprintf("worker %d (%s, %s)", r.worker, r.task, r.addr)
	switch r.state {
	case peerFinished:
		return who + " has finished: it closed its strategy and left while this worker's step still needed it"
	case peerUnresponsive:
		return who + " is unresponsive: it accepts connections but does not answer (busy elsewhere, stopped, wedged or overloaded)"
	case peerDead:
		return who + " is dead: it does not accept connections and left without closing its strategy (killed or crashed)"
	}
	return who + " is not up: it does not accept connections"
}

// describe joins reports into one clause ("" for none).
func describe(reports []peerReport) string {
	parts := make([]string, len(reports))
	for i, r := range reports {
		parts[i] = r.String()
	}
	return strings.Join(parts, "; ")
}

// duplicateRequest is in the error of a step that a TensorFlow worker
// refused because its request id repeated one of its last 100,000.
const duplicateRequest = "request was received twice"

// diagnose names the peers behind a run's failure when it is one a peer
// causes (an error of the step's collectives, or the step's deadline): a
// peer that has finished, one that is unresponsive, one that is dead. Such
// a failure ends the strategy: the error wraps strategy.ErrCannotContinue.
func (s *Strategy) diagnose(err error) error {
	if s.group != nil {
		if gerr := s.group.Err(); gerr != nil {
			what := describe(s.enginePeers(gerr))
			if what == "" && s.waitedFor(gerr) {
				what = "a peer gave up waiting for this worker, which came to the operation too late (busy elsewhere, or stopped)"
			}
			return s.cannotContinue(what, err)
		}
	}
	if !(errors.Is(err, tfrt.ErrUnavailable) || errors.Is(err, tfrt.ErrDeadlineExceeded) ||
		errors.Is(err, tfrt.ErrAborted) || errors.Is(err, tfrt.ErrCancelled) || errors.Is(err, tfrt.ErrUnknown)) {
		return err
	}
	what := ""
	if strings.Contains(err.Error(), duplicateRequest) {
		what = "TensorFlow's runtime refused the step as a repeated request, a defect of its distributed sessions " +
			"(each step's request id has only 32 random bits, and a worker refuses one it saw among its last 100,000), " +
			"which ends a step loop every few tens of thousands of steps"
	} else if s.group == nil {
		what = s.unreachable(false)
		if what == "" && errors.Is(err, tfrt.ErrDeadlineExceeded) {
			what = "every peer is alive and answers, but one did not join the step's collectives within the timeout " +
				"(busy elsewhere, or calling in another order)"
		}
	}
	return s.cannotContinue(what, err)
}

// cannotContinue is a failed step's error: what went wrong (a general
// statement when empty), the run's error, and ErrCannotContinue.
func (s *Strategy) cannotContinue(what string, err error) error {
	if what == "" {
		what = "a step across workers failed"
	}
	return fmt.Errorf("multiworker: task %s: %s: %w; %w", s.task, what, err, strategy.ErrCannotContinue)
}

// enginePeers reports the peers that broke the group on tfdist's engine
// with gerr: one that left it or said it was closing it (finished, whether
// or not its process still runs), one whose connection was lost and that
// no longer accepts connections (dead), the ones an operation timed out
// waiting for (unresponsive, or dead).
func (s *Strategy) enginePeers(gerr error) []peerReport {
	var pe *collective.PeerError
	var te *collective.TimeoutError
	switch {
	case errors.As(gerr, &pe) && errors.Is(gerr, collective.ErrPeerLeft):
		var out []peerReport
		for _, w := range s.workersOf(pe.Peer) {
			out = append(out, s.report(w, peerFinished))
		}
		return out
	case errors.As(gerr, &pe) && errors.Is(gerr, collective.ErrPeerLost):
		return s.checkPeers(s.workersOf(pe.Peer), false, func(int) peerState { return 0 })
	case errors.As(gerr, &te):
		return s.checkPeers(s.workersOf(te.Peers...), false, func(int) peerState { return peerUnresponsive })
	}
	return nil
}

// waitedFor reports whether gerr is a peer's timeout that waited for this
// worker: the peer broke the group with it.
func (s *Strategy) waitedFor(gerr error) bool {
	var te *collective.TimeoutError
	return errors.As(gerr, &te) && slices.ContainsFunc(te.Peers, func(m collective.Member) bool { return m.Name == s.task.String() })
}

// workersOf returns the worker indices of the group's members, this
// worker's left out.
func (s *Strategy) workersOf(members ...collective.Member) []int {
	var out []int
	for w, t := range s.workers {
		for _, m := range members {
			if m.Name == t.String() && w != s.workerID {
				out = append(out, w)
			}
		}
	}
	return out
}

// unreachable describes the other workers that are not well (see
// checkPeers), on TensorFlow's collectives, where a failure does not say
// which peer caused it; "" when every peer is well.
func (s *Strategy) unreachable(startup bool) string {
	var all []int
	for w := range s.workers {
		if w != s.workerID {
			all = append(all, w)
		}
	}
	return describe(s.checkPeers(all, startup, s.responds))
}

// checkPeers checks workers at once and reports those that are not well:
// a peer that said it finished (on TensorFlow's collectives, see
// announceFinished); one that does not accept TCP connections within 2 s
// (dead; at start-up, not up yet); and otherwise what alive says of it (0
// when well).
func (s *Strategy) checkPeers(workers []int, startup bool, alive func(w int) peerState) []peerReport {
	var finished map[int]bool
	if s.server != nil && !startup {
		finished = s.finishedPeers()
	}
	reports := make([]peerReport, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		reports[i] = s.report(w, 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			reports[i].state = s.checkPeer(w, reports[i].addr, finished[w], startup, alive)
		}()
	}
	wg.Wait()
	return slices.DeleteFunc(reports, func(r peerReport) bool { return r.state == 0 })
}

// report describes worker w in state.
func (s *Strategy) report(w int, state peerState) peerReport {
	t := s.workers[w]
	addr, _ := s.resolver.ClusterSpec().TaskAddress(t.Type, t.Index)
	return peerReport{worker: w, task: t, addr: addr, state: state}
}

func (s *Strategy) checkPeer(w int, addr string, finished, startup bool, alive func(int) peerState) peerState {
	if finished {
		return peerFinished
	}
	if err := s.dialPeer(addr); err != nil {
		if startup {
			return peerNotUp
		}
		return peerDead
	}
	return alive(w)
}

// dialPeer reports whether a peer's address accepts connections within
// 2 s: its TensorFlow server's, ended so that the server keeps no socket
// (probe.Server), or the engine's listener.
func (s *Strategy) dialPeer(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.server != nil {
		return probe.Server(ctx, addr)
	}
	return probe.Port(ctx, addr)
}

// responds runs a trivial op on worker w's CPU through this task's server
// and reports it unresponsive unless the op comes back within 3 s (a
// TensorFlow server on the same network answers in milliseconds).
func (s *Strategy) responds(w int) peerState {
	const timeout = 3 * time.Second
	t := s.workers[w]
	g := tf.NewGraph()
	sc := op.NewScopeWithGraph(g).WithDevice(cluster.DeviceName(string(t.Type), t.Index, "CPU", 0))
	c := op.Const(sc.SubScope("probe"), int32(1))
	if sc.Err() != nil {
		return peerUnresponsive
	}
	so, err := tfrt.SessionOptions(s.server.Target(), tfrt.WithDeviceFilters(taskFilter(t), taskFilter(s.task)),
		tfrt.WithOperationTimeout(timeout))
	if err != nil {
		return peerUnresponsive
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Second)
	defer cancel()
	if _, err := runOnce(ctx, g, so, []tf.Output{c}, nil); err != nil {
		return peerUnresponsive
	}
	return 0
}

// taskFilter is the device filter of task t's devices.
func taskFilter(t cluster.Task) string { return fmt.Sprintf("/job:%s/task:%d", t.Type, t.Index) }

// finishedName is the shared name of the variable that worker w sets on
// every peer's CPU when it has finished (announceFinished).
func finishedName(w int) string { return fmt.Sprintf("_tfdist/multiworker/finished/worker_%d", w) }

// announceFinished tells every peer, on TensorFlow's collectives, that
// this worker has finished: it sets the variable finishedName(w) on each
// peer's CPU, which stays in the peer's TensorFlow server after this
// process exits, so that a peer whose step fails for want of this worker
// says it finished (finishedPeers) rather than died. A peer that does not
// take the mark within announceTimeout is left without it.
func (s *Strategy) announceFinished() {
	const announceTimeout = 5 * time.Second
	var wg sync.WaitGroup
	for w, t := range s.workers {
		if w == s.workerID {
			continue
		}
		g := tf.NewGraph()
		sc := op.NewScopeWithGraph(g).WithDevice(cluster.DeviceName(string(t.Type), t.Index, "CPU", 0))
		h := op.VarHandleOp(sc, tf.Int64, tf.ScalarShape(), op.VarHandleOpSharedName(finishedName(s.workerID)))
		set := op.AssignVariableOp(sc.SubScope("set"), h, op.Const(sc.SubScope("one"), int64(1)))
		so, err := tfrt.SessionOptions(s.server.Target(), tfrt.WithDeviceFilters(taskFilter(t), taskFilter(s.task)),
			tfrt.WithOperationTimeout(announceTimeout))
		if sc.Err() != nil || err != nil {
			s.log.Warn("cannot build the mark of a finished worker", zap.Error(errors.Join(sc.Err(), err)))
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
			defer cancel()
			if _, err := runOnce(ctx, g, so, nil, []*tf.Operation{set}); err != nil {
				s.log.Debug("a peer did not take the mark that this worker finished", zap.Stringer("peer", t), zap.Error(err))
			}
		}()
	}
	wg.Wait()
}

// finishedPeers returns the workers whose mark (announceFinished) this
// worker's TensorFlow server holds.
func (s *Strategy) finishedPeers() map[int]bool {
	g := tf.NewGraph()
	root := op.NewScopeWithGraph(g).WithDevice(cluster.DeviceName(string(s.task.Type), s.task.Index, "CPU", 0))
	var fetches []tf.Output
	var ws []int
	for w := range s.workers {
		if w != s.workerID {
			sc := root.SubScope(fmt.Sprintf("worker_%d", w))
			h := op.VarHandleOp(sc, tf.Int64, tf.ScalarShape(), op.VarHandleOpSharedName(finishedName(w)))
			fetches, ws = append(fetches, op.VarIsInitializedOp(sc.SubScope("set"), h)), append(ws, w)
		}
	}
	so, err := tfrt.SessionOptions(s.server.Target(), tfrt.WithDeviceFilters(taskFilter(s.task)),
		tfrt.WithOperationTimeout(5*time.Second))
	if root.Err() != nil || err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
	defer cancel()
	out, err := runOnce(ctx, g, so, fetches, nil)
	if err != nil {
		s.log.Debug("cannot read the marks of finished peers", zap.Error(err))
		return nil
	}
	finished := map[int]bool{}
	for i, w := range ws {
		finished[w] = tensorutil.Value(out[i]).(bool)
	}
	return finished
}

// runOnce runs fetches and targets of g in a session of their own, bounded
// by ctx, and closes the session when the run succeeded. A session whose
// peers are gone can hang in Close; after a failure it is left to the
// process's exit rather than block the caller.
func runOnce(ctx context.Context, g *tf.Graph, so *tf.SessionOptions, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error) {
	sess, err := tfrt.NewSessionContext(ctx, g, so)
	if err != nil {
		return nil, err
	}
	out, err := sess.Run(ctx, nil, fetches, targets)
	if err == nil {
		sess.Close()
	}
	return out, err
}
