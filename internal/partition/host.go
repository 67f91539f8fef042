package partition

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// Host is one task's TensorFlow graph and local session. The fragments of
// any number of plans are imported into it, each under a prefix of its
// own; ops of different fragments share resources by their shared names
// (a variable's VarHandleOp), as the ops of one graph do.
//
// By default a run on a Host is not interrupted when its context ends:
// interrupting closes the session and with it every resource it holds (a
// ps task's variables). A fragment holds no op that waits on another task,
// so its runs end on their own, unless the program's own ops wait (a queue
// that nothing fills): the host of a task that holds no state of its own
// (a worker) is made Interruptible.
type Host struct {
	g             *tf.Graph
	so            *tf.SessionOptions
	interruptible bool

	mu       sync.Mutex
	sess     *tfrt.Session
	prefixes map[string]map[string][]string // imported: the variables each placeholder updates
}

// HostOption configures NewHost.
type HostOption func(*Host)

// Interruptible makes a run whose context ends interrupt the host's
// session, which cancels every run in progress on it; the host goes on
// with a new session over the same graph, without what lived in the old
// one (queues, iterators, variables). For hosts whose state lives
// elsewhere only.
func Interruptible() HostOption { return func(h *Host) { h.interruptible = true } }

// NewHost returns a host whose session runs with options so (nil: the
// defaults).
func NewHost(so *tf.SessionOptions, opts ...HostOption) (*Host, error) {
	g := tf.NewGraph()
	sess, err := tfrt.NewSession(g, so)
	if err != nil {
		return nil, tfrt.Classify("open a session", err)
	}
	h := &Host{g: g, so: so, sess: sess, prefixes: map[string]map[string][]string{}}
	for _, o := range opts {
		o(h)
	}
	return h, nil
}

// session returns the host's session.
func (h *Host) session() *tfrt.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sess
}

// renew replaces old, a session a run's context interrupted, by a new one
// over the same graph, unless another run did already, and closes old once
// its runs have ended.
func (h *Host) renew(old *tfrt.Session) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sess != old {
		return nil
	}
	sess, err := tfrt.NewSession(h.g, h.so)
	if err != nil {
		return tfrt.Classify("open a new session after an interrupted run", err)
	}
	h.sess = sess
	go old.Close()
	return nil
}

// Import adds fragment to the host's graph under prefix, which no earlier
// import used.
func (h *Host) Import(prefix string, fragment []byte) error {
	if prefix == "" || strings.ContainsAny(prefix, ":^") {
		return fmt.Errorf("partition: import prefix %q: expected a non-empty op name", prefix)
	}
	updates, err := fragmentUpdates(fragment)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.prefixes[prefix]; ok {
		return fmt.Errorf("partition: import prefix %q: already imported", prefix)
	}
	if err := h.g.Import(fragment, prefix); err != nil {
		return fmt.Errorf("partition: import fragment %q: %w", prefix, err)
	}
	h.prefixes[prefix] = updates
	return nil
}

// Imported reports whether a fragment was imported under prefix.
func (h *Host) Imported(prefix string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.prefixes[prefix]
	return ok
}

// Runner returns the Runner of the fragment imported under prefix.
func (h *Host) Runner(prefix string) Runner {
	return &hostRunner{h: h, prefix: prefix, outputs: map[string]tf.Output{}, ops: map[string]*tf.Operation{},
		feeds: map[string]*feedSpec{}}
}

// Close releases the session.
func (h *Host) Close() error { return h.session().Close() }

type hostRunner struct {
	h      *Host
	prefix string

	mu      sync.Mutex
	outputs map[string]tf.Output
	ops     map[string]*tf.Operation
	feeds   map[string]*feedSpec // of the placeholders fed so far
}

func (r *hostRunner) Run(ctx context.Context, feeds map[string]*tf.Tensor, fetches, targets []string) ([]*tf.Tensor, error) {
	if !r.h.Imported(r.prefix) {
		return nil, fmt.Errorf("partition: no fragment imported under %q", r.prefix)
	}
	fm := make(map[tf.Output]*tf.Tensor, len(feeds))
	for name, t := range feeds {
		o, err := r.output(name)
		if err != nil {
			return nil, err
		}
		if spec := r.feedSpec(name, o); spec != nil {
			if err := spec.check(r.prefix, name, t); err != nil {
				return nil, err
			}
		}
		fm[o] = t
	}
	fo := make([]tf.Output, len(fetches))
	for i, name := range fetches {
		o, err := r.output(name)
		if err != nil {
			return nil, err
		}
		fo[i] = o
	}
	to := make([]*tf.Operation, len(targets))
	for i, name := range targets {
		op, err := r.op(name)
		if err != nil {
			return nil, err
		}
		to[i] = op
	}
	return r.h.run(ctx, fm, fo, to)
}

// run runs the session, which ctx interrupts when the host is
// Interruptible.
func (h *Host) run(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error) {
	sess := h.session()
	if !h.interruptible {
		ctx = context.WithoutCancel(ctx)
	}
	out, err := sess.Run(ctx, feeds, fetches, targets)
	if errors.Is(err, tfrt.ErrInterrupted) {
		if rerr := h.renew(sess); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	return out, tfrt.ClassifyStatus("run", err)
}

// feedSpec returns what the placeholder of output o, named name, takes;
// nil when o is not a placeholder's.
func (r *hostRunner) feedSpec(name string, o tf.Output) *feedSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.feeds[name]; ok {
		return f
	}
	var f *feedSpec
	if o.Op.Type() == "Placeholder" {
		r.h.mu.Lock()
		updates := r.h.prefixes[r.prefix][o.Op.Name()[len(r.prefix)+1:]]
		r.h.mu.Unlock()
		f = &feedSpec{dtype: o.DataType(), shape: o.Shape(), updates: updates}
	}
	r.feeds[name] = f
	return f
}

func (r *hostRunner) op(name string) (*tf.Operation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if op, ok := r.ops[name]; ok {
		return op, nil
	}
	op := r.h.g.Operation(r.prefix + "/" + name)
	if op == nil {
		return nil, fmt.Errorf("partition: fragment %q has no op %q", r.prefix, name)
	}
	r.ops[name] = op
	return op, nil
}

func (r *hostRunner) output(name string) (tf.Output, error) {
	r.mu.Lock()
	o, ok := r.outputs[name]
	r.mu.Unlock()
	if ok {
		return o, nil
	}
	opName, k := parseInput(name)
	op, err := r.op(opName)
	if err != nil {
		return tf.Output{}, err
	}
	if k < 0 || k >= op.NumOutputs() {
		return tf.Output{}, fmt.Errorf("partition: fragment %q: op %q has no output %s", r.prefix, opName, strconv.Itoa(k))
	}
	o = op.Output(k)
	r.mu.Lock()
	r.outputs[name] = o
	r.mu.Unlock()
	return o, nil
}
