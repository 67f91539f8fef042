package ingraph

import (
	"errors"
	"fmt"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// merger runs replica functions one at a time, tf.distribute's way: each
// replica runs until it returns or reaches a merge point; when every replica
// waits at the same merge point, the merge function runs once with all their
// arguments and each replica resumes with its own result.
type merger struct {
	n      int
	ns     string
	events chan mergeEvent
	resume []chan mergeResult
}

type mergeEvent struct {
	replica int
	kind    string // "" when the replica function returned
	arg     any
	fn      func([]any) ([]any, error)
	done    bool
}

type mergeResult struct {
	value any
	err   error
}

// errAborted is returned at a merge point after another replica failed.
var errAborted = errors.New("aborted: another replica failed")

func newMerger(n int, ns string) *merger {
	m := &merger{n: n, ns: ns, events: make(chan mergeEvent), resume: make([]chan mergeResult, n)}
	for i := range m.resume {
		m.resume[i] = make(chan mergeResult)
	}
	return m
}

// call is made by replica r's goroutine at a merge point; it blocks until the
// merge has run.
func (m *merger) call(r int, kind string, arg any, fn func([]any) ([]any, error)) (any, error) {
	m.events <- mergeEvent{replica: r, kind: kind, arg: arg, fn: fn}
	res := <-m.resume[r]
	return res.value, res.err
}

// run traces body for every replica and returns the first error. body runs
// on its own goroutine per replica, but only one runs at a time.
func (m *merger) run(body func(r int) error) error {
	errs := make([]error, m.n)
	start := func(r int) mergeEvent {
		go func() {
			err := graphutil.Safely(func() error { return body(r) })
			errs[r] = err
			m.events <- mergeEvent{replica: r, done: true}
		}()
		return <-m.events
	}
	pending := make([]mergeEvent, m.n)
	for r := range m.n {
		pending[r] = start(r)
	}
	var firstErr error
	for {
		allDone, anyDone := true, false
		for _, ev := range pending {
			if ev.done {
				anyDone = true
			} else {
				allDone = false
			}
		}
		if allDone {
			break
		}
		var results []mergeResult
		switch {
		case anyDone:
			if firstErr == nil {
				firstErr = m.mismatch(pending, errs)
			}
			results = m.abort(pending, firstErr)
		default:
			kind := pending[0].kind
			for r, ev := range pending {
				if ev.kind != kind {
					err := &strategy.BuildError{Replica: r, Err: fmt.Errorf("calls %s where replica 0 calls %s; every replica must reach the same merge points in the same order", ev.kind, kind)}
					if firstErr == nil {
						firstErr = err
					}
				}
			}
			if firstErr != nil {
				results = m.abort(pending, firstErr)
				break
			}
			args := make([]any, m.n)
			for r, ev := range pending {
				args[r] = ev.arg
			}
			var vals []any
			err := graphutil.Safely(func() error {
				var err error
				vals, err = pending[0].fn(args)
				return err
			})
			if err != nil {
				firstErr = &strategy.BuildError{Replica: -1, Err: fmt.Errorf("%s: %w", kind, err)}
				results = m.abort(pending, firstErr)
				break
			}
			results = make([]mergeResult, m.n)
			for r := range results {
				results[r] = mergeResult{value: vals[r]}
			}
		}
		for r, ev := range pending {
			if ev.done {
				continue
			}
			m.resume[r] <- results[r]
			pending[r] = <-m.events
		}
	}
	for r, err := range errs {
		if err != nil && !errors.Is(err, errAborted) {
			var be *strategy.BuildError
			if errors.As(err, &be) {
				return err
			}
			return &strategy.BuildError{Replica: r, Err: err}
		}
	}
	return firstErr
}

func (m *merger) abort(pending []mergeEvent, err error) []mergeResult {
	res := make([]mergeResult, len(pending))
	for r := range res {
		res[r] = mergeResult{err: fmt.Errorf("%w (%v)", errAborted, err)}
	}
	return res
}

func (m *merger) mismatch(pending []mergeEvent, errs []error) error {
	for r, ev := range pending {
		if ev.done && errs[r] != nil {
			return &strategy.BuildError{Replica: r, Err: errs[r]}
		}
	}
	for r, ev := range pending {
		if !ev.done {
			return &strategy.BuildError{Replica: r, Err: fmt.Errorf("calls %s but another replica returned without it; every replica must reach the same merge points", ev.kind)}
		}
	}
	return nil
}
