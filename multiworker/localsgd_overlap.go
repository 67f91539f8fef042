package multiworker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// overlap is Streaming DiLoCo's overlap of the outer all-reduce with the
// inner steps (LocalSGD.Overlap): after each step that is a fragment's
// turn, the worker takes the fragment's outer gradient into a variable of
// its own (a stage), the strategy all-reduces it in the background on the
// engine's group (bounded by the group's collective timeout), and Overlap
// steps later writes the sum into the stage and runs the fragment's outer
// update from it, then its reset.
type overlap struct {
	stages []strategy.Variable // each fragment's outer gradient, flat: this worker's, then the sum
	takes  []strategy.Step     // stage = (anchors - parameters), packed
	lands  []strategy.Step     // the outer update of the fragment from its stage

	mu      sync.Mutex
	flights map[int]*flight // by fragment
}

// flight is an outer gradient being all-reduced.
type flight struct {
	begin time.Time
	done  chan flown
}

type flown struct {
	sum []byte
	err error
}

// stagePrefix prefixes the stages' names: variables each worker has its
// own value of, which checkpoints save a copy a worker of.
const stagePrefix = "tfdist_outer_gradient/fragment_"

// buildOverlap makes a stage for every fragment and builds its steps.
func (l *localSGD) buildOverlap(s *Strategy) (*overlap, error) {
	o := &overlap{flights: map[int]*flight{}}
	if err := s.engine.Scope(func(sc strategy.Scope) error {
		for f, idx := range l.frags {
			var n int64
			for _, i := range idx {
				n += tensorutil.NumElements(l.vars[i].Shape())
			}
			v, err := sc.Variable(fmt.Sprintf("%s%d", stagePrefix, f), tf.Float, []int64{n}, strategy.Zeros(), strategy.Trainable(false))
			if err != nil {
				return err
			}
			o.stages = append(o.stages, v)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for f, idx := range l.frags {
		take, err := s.engine.Build(syncSpec, func(rc strategy.Replica, _ strategy.Inputs) (strategy.Outputs, error) {
			ds, err := l.deltas(rc.(*ingraph.ReplicaContext), idx)
			if err != nil {
				return nil, err
			}
			return strategy.Outputs{}, rc.(*ingraph.ReplicaContext).Overwrite(o.stages[f], l.pack(rc.Scope().SubScope("local_sgd_take"), ds))
		})
		if err != nil {
			return nil, err
		}
		land, err := l.buildOuter(s, idx, func(rc *ingraph.ReplicaContext) ([]tf.Output, error) {
			sum, err := rc.Read(o.stages[f])
			if err != nil {
				return nil, err
			}
			return l.unpack(rc.Scope().SubScope("local_sgd_landed"), sum, idx), nil
		})
		if err != nil {
			return nil, err
		}
		o.takes, o.lands = append(o.takes, take), append(o.lands, land)
	}
	return o, nil
}

// after lands, after training step n, the outer gradient taken Overlap
// steps before, and takes the one whose turn it is.
func (o *overlap) after(ctx context.Context, s *Strategy, l *localSGD, n int64) error {
	var landing []int
	if taken := n - int64(l.cfg.Overlap); taken > int64(l.cfg.WarmupSteps) {
		landing = l.due(taken)
	}
	for _, f := range landing {
		begin, err := o.land(ctx, s, l, f)
		if err != nil {
			return fmt.Errorf("multiworker: local SGD: land fragment %d after step %d: %w", f, n, err)
		}
		l.observe(s, fmt.Sprintf("synchronise fragment %d after step %d", f, n), begin)
	}
	for _, f := range l.due(n) {
		if err := o.take(ctx, s, l, f); err != nil {
			return fmt.Errorf("multiworker: local SGD: take fragment %d after step %d: %w", f, n, err)
		}
	}
	return nil
}

// take takes fragment f's outer gradient into its stage and starts its
// all-reduce.
func (o *overlap) take(ctx context.Context, s *Strategy, l *localSGD, f int) error {
	if err := l.run(ctx, s, o.takes[f]); err != nil {
		return err
	}
	fl, err := o.send(ctx, s, l, f)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.flights[f] = fl
	o.mu.Unlock()
	return nil
}

// send reads fragment f's stage and starts its all-reduce in the
// background, whose flight it returns.
func (o *overlap) send(ctx context.Context, s *Strategy, l *localSGD, f int) (*flight, error) {
	fl := &flight{begin: time.Now(), done: make(chan flown, 1)}
	t, err := s.engine.Value(ctx, o.stages[f])
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := t.WriteContentsTo(&buf); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	if s.group == nil { // one worker: its own is the sum
		fl.done <- flown{sum: data}
		return fl, nil
	}
	go func() {
		err := s.group.AllReduce(context.Background(), fmt.Sprintf("tfdist_local_sgd/stage/%d", f), collective.Sum, collective.Float32, data, collective.Compress(l.cfg.Compression.wire()))
		fl.done <- flown{sum: data, err: err}
	}()
	return fl, nil
}

// land waits for fragment f's all-reduce, writes the sum into its stage
// and runs its outer update and its reset. A fragment taken before a
// restore has no flight in this process: its stage, restored, holds this
// worker's outer gradient, which it all-reduces now. It returns when the
// outer gradient was taken.
func (o *overlap) land(ctx context.Context, s *Strategy, l *localSGD, f int) (time.Time, error) {
	o.mu.Lock()
	fl := o.flights[f]
	delete(o.flights, f)
	o.mu.Unlock()
	if fl == nil {
		var err error
		if fl, err = o.send(ctx, s, l, f); err != nil {
			return time.Now(), err
		}
	}
	var got flown
	select {
	case got = <-fl.done:
	case <-ctx.Done():
		return fl.begin, ctx.Err()
	}
	if got.err != nil {
		return fl.begin, errors.Join(got.err, strategy.ErrCannotContinue)
	}
	sum, err := tf.ReadTensor(tf.Float, o.stages[f].Shape(), bytes.NewReader(got.sum))
	if err == nil {
		err = s.engine.Assign(ctx, o.stages[f], sum)
	}
	if err == nil {
		err = l.update(ctx, s, o.lands[f], f)
	}
	return fl.begin, err
}
