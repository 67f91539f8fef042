package paramserver

import (
	"fmt"
	"sort"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// Function is a step function built for every worker: a copy of it in each
// worker's graph, any of which a Coordinator runs for a scheduled step.
//
// A Function that updates variables (its step calls Minimize) carries a
// guard that makes each scheduled step's update take effect once even when
// the step runs more than once. Every scheduled step has an id; after its
// gradients are computed, a step reads, on ps 0, the ids of the last step
// each worker applied, and applies its update — and records its id and
// increments the applied-steps counter, in one op — only if its id is not
// among them. A step whose worker died after its update was applied is
// therefore run again elsewhere for its outputs, but its update is not
// applied again (its RunInfo.Applied is false). The guard cannot make a
// step atomic across ps tasks: a worker that dies in the microseconds in
// which the ps tasks apply one step's update may leave part of it applied,
// and the rerun then applies that part again (at-least-once, as TensorFlow's
// ClusterCoordinator) — but never loses a step.
type Function struct {
	s        *Strategy
	name     string
	spec     strategy.InputSpec
	names    []string // input names, sorted
	outNames []string
	updates  bool
	workers  []*workerFn
}

// workerFn is a Function's copy in one worker's graph.
type workerFn struct {
	inputs  []tf.Output // by name order
	batch   tf.Output
	cid     tf.Output // unset without updates
	fetches []tf.Output
	applied tf.Output // unset without updates
	targets []*tf.Operation
}

// Name returns the function's name, for logs and errors.
func (f *Function) Name() string { return f.name }

// OutputNames returns the names of the outputs a run fetches, sorted.
func (f *Function) OutputNames() []string { return append([]string(nil), f.outNames...) }

// Updates reports whether the function applies updates to variables.
func (f *Function) Updates() bool { return f.updates }

// Build traces fn once per worker, into each worker's graph, and returns the
// Function a Coordinator schedules. spec gives each input's type and shape
// (-1 for the batch dimension). Every problem — an error of fn, an op
// without a gradient, a variable of another strategy, workers whose steps
// disagree — is reported here as a *strategy.BuildError naming the worker,
// never at run time. New optimizer slots are created on the ps tasks and
// initialised before Build returns.
func (s *Strategy) Build(spec strategy.InputSpec, fn strategy.ReplicaFn) (*Function, error) {
	if fn == nil {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("nil step function")}
	}
	if len(spec) == 0 {
		return nil, &strategy.BuildError{Replica: -1, Err: fmt.Errorf("empty input spec")}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	start := time.Now()
	f := &Function{s: s, name: fmt.Sprintf("fn_%d", s.nfn), spec: spec}
	s.nfn++
	for name := range spec {
		f.names = append(f.names, name)
	}
	sort.Strings(f.names)
	for _, w := range s.workers {
		wf, outs, updates, err := s.trace(f, w, fn)
		if err != nil {
			return nil, &strategy.BuildError{Replica: w.index, Err: err}
		}
		if w.index == 0 {
			f.outNames, f.updates = outs, updates
		} else if strings.Join(outs, ",") != strings.Join(f.outNames, ",") || updates != f.updates {
			return nil, &strategy.BuildError{Replica: w.index, Err: fmt.Errorf("returns outputs %v (updates: %v), worker 0 returns %v (updates: %v)",
				outs, updates, f.outNames, f.updates)}
		}
		f.workers = append(f.workers, wf)
	}
	if err := s.initPending(); err != nil {
		return nil, &strategy.BuildError{Replica: -1, Err: err}
	}
	s.log.Debug("function built", zap.String("function", f.name), zap.Strings("inputs", f.names),
		zap.Strings("outputs", f.outNames), zap.Bool("updates", f.updates), zap.Duration("took", time.Since(start)))
	return f, nil
}

// trace builds fn in w's graph.
func (s *Strategy) trace(f *Function, w *workerGraph, fn strategy.ReplicaFn) (*workerFn, []string, bool, error) {
	root := w.newScope(f.name) // f.name is unique: root's namespace is f.name
	ns := f.name
	scope := root.WithDevice(w.device)
	wf := &workerFn{}
	rc := &replicaContext{s: s, w: w, ns: ns, root: root, scope: scope,
		reads: map[*Variable]*denseRead{}, lookups: map[*Variable][]*lookup{}}
	in := strategy.Inputs{}
	for _, name := range f.names {
		ts := f.spec[name]
		p := op.Placeholder(scope.SubScope("input_"+sanitize(name)), ts.DType, op.PlaceholderShape(tf.MakeShape(ts.Shape...)))
		wf.inputs = append(wf.inputs, p)
		in[name] = p
	}
	wf.batch = op.Placeholder(scope.SubScope("batch_size"), tf.Float, op.PlaceholderShape(tf.ScalarShape()))
	rc.batch = wf.batch
	if err := root.Err(); err != nil {
		return nil, nil, false, err
	}
	var out strategy.Outputs
	err := graphutil.Safely(func() (err error) { out, err = fn(rc, in); return err })
	if err != nil {
		if serr := root.Err(); serr != nil {
			return nil, nil, false, fmt.Errorf("%w; the graph reports: %v", err, firstLine(serr))
		}
		return nil, nil, false, err
	}
	if err := root.Err(); err != nil {
		return nil, nil, false, err
	}
	out, err = withReduced(out, &rc.reduced)
	if err != nil {
		return nil, nil, false, err
	}
	outNames := make([]string, 0, len(out))
	for name, o := range out {
		if o.Op == nil {
			return nil, nil, false, fmt.Errorf("output %q: no op (was it built from a failed scope?)", name)
		}
		outNames = append(outNames, name)
	}
	sort.Strings(outNames)
	for _, name := range outNames {
		o := out[name]
		if o.Op.Type() == "Placeholder" {
			o = op.Identity(scope.SubScope("output_"+sanitize(name)), o) // TensorFlow cannot fetch what it is fed
		}
		wf.fetches = append(wf.fetches, o)
	}
	mark, err := rc.finish()
	if err != nil {
		return nil, nil, false, err
	}
	wf.targets = append(wf.targets, rc.targets...)
	if mark != nil {
		wf.cid, wf.applied = rc.guard.cid, rc.guard.pred
		wf.targets = append(append(wf.targets, rc.applies...), mark)
	}
	return wf, outNames, mark != nil, root.Err()
}

// withReduced returns the step function's outputs with its reduced outputs
// added: each is the worker's own value.
func withReduced(out strategy.Outputs, red *strategy.ReducedOutputs) (strategy.Outputs, error) {
	if err := red.Check(out); err != nil {
		return nil, err
	}
	all := make(strategy.Outputs, len(out))
	for name, o := range out {
		all[name] = o
	}
	for _, o := range red.List() {
		all[o.Name] = o.Value
	}
	return all, nil
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.Index(s, " (Stacktrace"); i >= 0 {
		s = s[:i]
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// feeds checks a step's input against the function's spec and returns the
// feeds of worker w's copy.
func (f *Function) feeds(w int, in map[string]*tf.Tensor, cid int64) (map[tf.Output]*tf.Tensor, error) {
	wf := f.workers[w]
	fm := make(map[tf.Output]*tf.Tensor, len(f.names)+2)
	for i, name := range f.names {
		t, ok := in[name]
		if !ok || t == nil {
			return nil, fmt.Errorf("input %q missing (the function takes %v)", name, f.names)
		}
		if err := f.spec[name].Check(name, t); err != nil {
			return nil, err
		}
		fm[wf.inputs[i]] = t
	}
	n := int64(1)
	if sh := in[f.names[0]].Shape(); len(sh) > 0 {
		n = sh[0]
	}
	bt, err := tf.NewTensor(float32(n))
	if err != nil {
		return nil, err
	}
	fm[wf.batch] = bt
	if f.updates {
		ct, err := tf.NewTensor(cid)
		if err != nil {
			return nil, err
		}
		fm[wf.cid] = ct
	}
	return fm, nil
}
