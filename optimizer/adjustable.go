package optimizer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Adjustable is a learning rate that the program reads and sets between
// steps, as Keras's optimizer.learning_rate when the optimizer was given a
// number: the rate is a float32 variable of the strategy,
// "<optimizer>/learning_rate", which every step reads. The optimizer
// creates it when a step that applies it is built, through the strategy's
// ApplyContext, so it is kept like the optimizer's step count: one copy
// per replica under the in-graph strategies, one variable on the first ps
// task under parameter servers, and saved in checkpoints with the other
// variables (a restore restores the rate).
//
// Set writes the rate that every later step trains at. Under
// MultiWorkerMirrored each worker sets its own copies, so every worker
// must set the same rate, as callbacks that decide from the logs of Fit
// do. Like Keras, this package sets only a rate that is a number: a decay
// computed from the step count is a Schedule, which the program cannot
// set.
//
// One Adjustable serves one optimizer (by name): give each optimizer its
// own. It is safe for concurrent use.
type Adjustable struct {
	mu      sync.Mutex
	initial float32
	name    string      // the variable's, once an optimizer has built it
	host    *hostAccess // the ops that read and write it in the last State used
}

// hostAccess reads and writes the rate's variable in one strategy.
type hostAccess struct {
	st       strategy.State
	read     tf.Output
	value    tf.Output // the rate Set feeds
	write    []*tf.Operation
	restored func()
}

// adjustableSlot is the name of the rate's variable under its optimizer's.
const adjustableSlot = "learning_rate"

// NewAdjustable returns a learning rate that starts at lr and that the
// program can set between steps.
func NewAdjustable(lr float32) *Adjustable { return &Adjustable{initial: lr} }

// Build implements Schedule for an Adjustable outside an optimizer, where
// it has no variable: it fails the scope's build. An optimizer of this
// package builds it with the strategy's ApplyContext instead; inside
// another schedule (Warmup.Then) it cannot be built.
func (a *Adjustable) Build(s *op.Scope, _ tf.Output) tf.Output {
	s.UpdateErr("Adjustable", errors.New("an Adjustable learning rate is a variable its optimizer creates: give it to the optimizer itself, not inside another schedule"))
	return op.Const(s, a.initialRate())
}

// Validate checks that the initial rate is finite and not negative.
func (a *Adjustable) Validate() error {
	return nonNegative("Adjustable learning rate", a.initialRate())
}

func (a *Adjustable) initialRate() float32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.initial
}

// buildIn returns the rate of the optimizer owner's step: its variable,
// created through ac on first use, read on s.
func (a *Adjustable) buildIn(ac strategy.ApplyContext, owner string, s *op.Scope) (tf.Output, error) {
	a.mu.Lock()
	name, initial := a.name, a.initial
	a.mu.Unlock()
	if want := owner + "/" + adjustableSlot; name != "" && name != want {
		return tf.Output{}, fmt.Errorf("%s: the Adjustable learning rate is the variable %q of another optimizer, expected one of its own", owner, name)
	}
	init, err := tf.NewTensor(initial)
	if err != nil {
		return tf.Output{}, err
	}
	v, err := ac.NonSlot(owner, adjustableSlot, tf.Float, nil, strategy.Constant(init))
	if err != nil {
		return tf.Output{}, fmt.Errorf("%s: learning rate: %w", owner, err)
	}
	a.mu.Lock()
	a.name = v.Name()
	a.mu.Unlock()
	return op.ReadVariableOp(s, ac.Handle(v), tf.Float), s.Err()
}

// Value returns the rate that the strategy whose State st is trains its
// next step at. Until a step that applies the optimizer has been built in
// that strategy, it is the rate the variable will start at.
func (a *Adjustable) Value(ctx context.Context, st strategy.State) (float32, error) {
	h, err := a.access(st)
	if err != nil {
		return 0, err
	}
	if h == nil {
		return a.initialRate(), nil
	}
	out, err := st.Run(ctx, nil, []tf.Output{h.read}, nil, nil)
	if err != nil {
		return 0, fmt.Errorf("optimizer: read the learning rate: %w", err)
	}
	v, ok := out[0].Value().(float32)
	if !ok {
		return 0, fmt.Errorf("optimizer: the learning rate %q is %v, expected a float32 scalar", a.name, out[0].Value())
	}
	return v, nil
}

// Set sets the rate that the strategy whose State st is trains its later
// steps at; lr must be finite and not negative. Until a step that applies
// the optimizer has been built in that strategy, it sets the rate the
// variable will start at.
func (a *Adjustable) Set(ctx context.Context, st strategy.State, lr float32) error {
	if err := nonNegative("optimizer: learning rate", lr); err != nil {
		return err
	}
	h, err := a.access(st)
	if err != nil {
		return err
	}
	if h == nil {
		a.mu.Lock()
		a.initial = lr
		a.mu.Unlock()
		return nil
	}
	val, err := tf.NewTensor(lr)
	if err != nil {
		return err
	}
	if _, err := st.Run(ctx, map[tf.Output]*tf.Tensor{h.value: val}, nil, h.write, h.restored); err != nil {
		return fmt.Errorf("optimizer: set the learning rate: %w", err)
	}
	return nil
}

// access returns the ops that read and write the rate's variable in st,
// built on first use, or nil while st has no such variable. It calls st
// without holding a.mu: a strategy that is building a step holds its own
// lock and then takes a.mu (buildIn).
func (a *Adjustable) access(st strategy.State) (*hostAccess, error) {
	if st == nil {
		return nil, errors.New("optimizer: learning rate: nil strategy state")
	}
	a.mu.Lock()
	name, h := a.name, a.host
	a.mu.Unlock()
	if name == "" {
		return nil, nil
	}
	if h != nil && sameState(h.st, st) {
		return h, nil
	}
	var sv *strategy.Saveable
	for _, s := range st.Saveables() {
		if s.Name == name {
			sv = &s
			break
		}
	}
	if sv == nil {
		return nil, nil
	}
	if len(sv.Slices) != 1 || sv.DType != tf.Float || len(sv.Shape) != 0 {
		return nil, fmt.Errorf("optimizer: the learning rate %q is %d slices of %v shape %v, expected one float32 scalar", name, len(sv.Slices), sv.DType, sv.Shape)
	}
	slice := sv.Slices[0]
	h = &hostAccess{st: st, restored: slice.Restored}
	err := st.Extend(adjustableSlot, func(sc *op.Scope) (err error) {
		if h.read, err = slice.Read(sc.SubScope("read")); err != nil {
			return err
		}
		h.value = op.Placeholder(sc.SubScope("value").WithDevice(st.HostDevice()), tf.Float, op.PlaceholderShape(tf.ScalarShape()))
		h.write, err = slice.Write(sc.SubScope("write"), h.value)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("optimizer: learning rate %q: %w", name, err)
	}
	a.mu.Lock()
	a.host = h
	a.mu.Unlock()
	return h, nil
}

// sameState reports whether x and y are the same strategy's State, when
// their type can tell.
func sameState(x, y strategy.State) bool {
	return reflect.TypeOf(x) == reflect.TypeOf(y) && reflect.TypeOf(x).Comparable() && x == y
}

// Schedule returns the optimizer's learning-rate schedule.
func (b *base) Schedule() Schedule { return b.lr }

// buildRate returns the learning rate of the optimizer owner's step from
// its schedule lr: an Adjustable's variable, or lr built from the step
// count.
func buildRate(ac strategy.ApplyContext, owner string, lr Schedule, s *op.Scope, step tf.Output) (tf.Output, error) {
	if a, ok := lr.(*Adjustable); ok {
		return a.buildIn(ac, owner, s)
	}
	out := lr.Build(s, step)
	if err := s.Err(); err != nil {
		return tf.Output{}, fmt.Errorf("%s: learning rate: %w", owner, err)
	}
	return out, nil
}

// AdjustableOf returns the Adjustable learning rate of opt, an optimizer
// of this package or one wrapping it (LossScale, Clipped, Private, or any
// optimizer with an Inner() strategy.Optimizer method). When opt's rate is
// another schedule the error names it.
func AdjustableOf(opt strategy.Optimizer) (*Adjustable, error) {
	for o := opt; ; {
		switch x := o.(type) {
		case nil:
			return nil, errors.New("optimizer: nil optimizer has no learning rate")
		case interface{ Schedule() Schedule }:
			sched := x.Schedule()
			if a, ok := sched.(*Adjustable); ok {
				return a, nil
			}
			return nil, fmt.Errorf("optimizer: %T's learning rate is %s, which the program cannot set: expected an optimizer.NewAdjustable(rate)", o, describe(sched))
		case *LossScale:
			o = x.inner
		case *Clipped:
			o = x.inner
		case *Private:
			o = x.inner
		case interface{ Inner() strategy.Optimizer }:
			o = x.Inner()
		default:
			return nil, fmt.Errorf("optimizer: %T has no learning-rate schedule of package optimizer, expected one of its optimizers or a wrapper with an Inner method", o)
		}
	}
}

// describe names a schedule with its value: the constant
// optimizer.Constant(0.01), the schedule optimizer.ExponentialDecay{…}.
func describe(s Schedule) string {
	if c, ok := s.(Constant); ok {
		return fmt.Sprintf("the constant optimizer.Constant(%v)", float32(c))
	}
	return fmt.Sprintf("the schedule %T%+v", s, s)
}
