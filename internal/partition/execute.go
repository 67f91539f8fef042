package partition

import (
	"context"
	"fmt"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
)

// Runner runs one task's fragment of a plan: feeds and fetches name
// tensors of the fragment, targets its ops.
type Runner interface {
	Run(ctx context.Context, feeds map[string]*tf.Tensor, fetches, targets []string) ([]*tf.Tensor, error)
}

// RunError is the error of one run of a plan, naming its task.
type RunError struct {
	Task  string
	Round int
	Err   error
}

func (e *RunError) Error() string {
	return fmt.Sprintf("task %s (round %d): %v", e.Task, e.Round, e.Err)
}

func (e *RunError) Unwrap() error { return e.Err }

// Execute runs the plan once: runners holds a Runner of every task the
// plan names, feeds the caller's values by the names of Plan.Feeds. It
// returns the values of Plan.Fetches, in order. The first run that fails
// ends the plan with a *RunError; the other runs of its round are
// cancelled through ctx.
func (p *Plan) Execute(ctx context.Context, runners map[string]Runner, feeds map[string]*tf.Tensor) ([]*tf.Tensor, error) {
	values := make(map[string]*tf.Tensor, len(feeds))
	for _, name := range p.Feeds {
		t, ok := feeds[name]
		if !ok || t == nil {
			return nil, fmt.Errorf("partition: value %s not fed (the plan feeds %v)", name, p.Feeds)
		}
		values[name] = t
	}
	for i, round := range p.Rounds {
		for _, run := range round {
			if runners[run.Task] == nil {
				return nil, fmt.Errorf("partition: no runner for task %s", run.Task)
			}
		}
		if err := p.round(ctx, i, round, runners, values); err != nil {
			return nil, err
		}
	}
	out := make([]*tf.Tensor, len(p.Fetches))
	for i, name := range p.Fetches {
		out[i] = values[name]
	}
	return out, nil
}

// round runs one round's runs concurrently and adds what they fetch to
// values.
func (p *Plan) round(ctx context.Context, i int, round []Run, runners map[string]Runner, values map[string]*tf.Tensor) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([][]*tf.Tensor, len(round))
	errs := make([]error, len(round))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first = -1 // the run that failed first; the others' errors may be its cancellation
	)
	for k, run := range round {
		feeds := make(map[string]*tf.Tensor, len(run.Feeds))
		for _, f := range run.Feeds {
			feeds[f.Tensor] = values[f.Value]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[k], errs[k] = runners[run.Task].Run(ctx, feeds, run.Fetches, run.Targets)
			if errs[k] != nil {
				mu.Lock()
				if first < 0 {
					first = k
				}
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	if first >= 0 {
		return &RunError{Task: round[first].Task, Round: i, Err: errs[first]}
	}
	for k, run := range round {
		if len(results[k]) != len(run.Fetches) {
			return &RunError{Task: run.Task, Round: i, Err: fmt.Errorf("%d values for %d fetches", len(results[k]), len(run.Fetches))}
		}
		for j, name := range run.Fetches {
			values[name] = results[k][j]
		}
	}
	return nil
}
