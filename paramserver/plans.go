package paramserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/taskserver"
)

// planSession runs the ops of one graph, the chief's or a worker's, on the
// tasks they are placed on, through the task servers: each distinct run
// (its feeds, fetches and targets) is split once into one fragment per task
// (package partition), the fragments are imported on their tasks, and the
// plan is executed round by round by the graph's own task — the chief
// itself for its graph, a worker's server for that worker's steps — so
// that values pass between a worker and the ps tasks directly.
type planSession struct {
	g      *tf.Graph
	prefix string // of its plans' ids, unique in the job
	self   string // the task that executes its plans
	local  *partition.Host
	exec   *taskserver.Client // the executing worker's server; nil on the chief
	tasks  *taskClients

	mu    sync.Mutex
	plans map[string]*sessionPlan
}

// taskClients holds a client of every ps and worker task, by task name
// ("/job:ps/replica:0/task:0"), and their addresses.
type taskClients struct {
	clients map[string]*taskserver.Client
	addrs   map[string]string
}

func (t *taskClients) close() {
	for _, c := range t.clients {
		c.Close()
	}
}

// sessionPlan is one run of a planSession's graph, planned.
type sessionPlan struct {
	id       string
	plan     *partition.Plan
	feeds    []tf.Output // by plan.Feeds
	imported map[string]bool
	ready    bool // the executing worker holds the plan
	runners  map[string]partition.Runner
}

// Run runs fetches and targets with feeds, as a session does.
func (ps *planSession) Run(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := ps.planned(feeds, fetches, targets)
	if err != nil {
		return nil, err
	}
	values := make(map[string]*tf.Tensor, len(feeds))
	for i, o := range p.feeds {
		values[p.plan.Feeds[i]] = feeds[o]
	}
	for attempt := 0; ; attempt++ {
		if err := ps.install(ctx, p); err != nil {
			return nil, err
		}
		var out []*tf.Tensor
		if ps.exec == nil {
			out, err = p.plan.Execute(ctx, p.runners, values)
		} else {
			out, err = ps.exec.RunPlan(ctx, p.id, values)
		}
		if errors.Is(err, taskserver.ErrUnknown) && attempt == 0 {
			ps.forget() // the executor restarted since: import and install again
			continue
		}
		return out, err
	}
}

// forget records that the executing task no longer holds the session's
// fragments and plans (it restarted). ps.mu is held.
func (ps *planSession) forget() {
	for _, p := range ps.plans {
		delete(p.imported, ps.self)
		p.ready = false
	}
}

// Forget is forget for a caller that found the executor restarted.
func (ps *planSession) Forget() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.forget()
}

// planned returns the plan of a run, making it on first use. ps.mu is held.
func (ps *planSession) planned(feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) (*sessionPlan, error) {
	spec := partition.Spec{Fetches: fetches, Targets: targets, Default: ps.self}
	for o := range feeds {
		spec.Feeds = append(spec.Feeds, o)
	}
	key := signature(spec)
	if p, ok := ps.plans[key]; ok {
		return p, nil
	}
	plan, err := partition.New(ps.g, spec)
	if err != nil {
		return nil, err
	}
	p := &sessionPlan{id: fmt.Sprintf("%s_%d", ps.prefix, len(ps.plans)), plan: plan, feeds: spec.Feeds,
		imported: map[string]bool{}}
	ps.plans[key] = p
	return p, nil
}

// signature identifies a run by the names of what it feeds, fetches and
// runs, in any order of feeds.
func signature(spec partition.Spec) string {
	var feeds []string
	for _, o := range spec.Feeds {
		feeds = append(feeds, fmt.Sprintf("%s:%d", o.Op.Name(), o.Index))
	}
	slices.Sort(feeds)
	var b strings.Builder
	b.WriteString(strings.Join(feeds, ","))
	b.WriteString("|")
	for _, o := range spec.Fetches {
		fmt.Fprintf(&b, "%s:%d,", o.Op.Name(), o.Index)
	}
	b.WriteString("|")
	for _, t := range spec.Targets {
		b.WriteString(t.Name() + ",")
	}
	return b.String()
}

// install imports p's fragments on the tasks that do not hold them yet and
// gives the plan to its executor. ps.mu is held.
func (ps *planSession) install(ctx context.Context, p *sessionPlan) error {
	for task, frag := range p.plan.Fragments {
		if p.imported[task] {
			continue
		}
		var err error
		if task == ps.self && ps.local != nil {
			err = ps.local.Import(p.id, frag)
		} else if c := ps.tasks.clients[task]; c != nil {
			err = c.Import(ctx, p.id, frag)
		} else {
			err = fmt.Errorf("the graph places ops on %s, which is not a task of the cluster (ps or worker)", task)
		}
		if err != nil {
			return &partition.RunError{Task: task, Round: -1, Err: fmt.Errorf("import %s: %w", p.id, err)}
		}
		p.imported[task] = true
	}
	if ps.exec == nil {
		if p.runners == nil {
			p.runners = map[string]partition.Runner{}
			for task := range p.plan.Fragments {
				if task == ps.self {
					p.runners[task] = ps.local.Runner(p.id)
				} else {
					p.runners[task] = ps.tasks.clients[task].Runner(p.id)
				}
			}
		}
		return nil
	}
	if p.ready {
		return nil
	}
	addrs := map[string]string{}
	for task := range p.plan.Fragments {
		addrs[task] = ps.tasks.addrs[task]
	}
	addrs[ps.self] = ""
	if err := ps.exec.InstallPlan(ctx, p.id, p.plan, addrs); err != nil {
		return &partition.RunError{Task: ps.self, Round: -1, Err: fmt.Errorf("install %s: %w", p.id, err)}
	}
	p.ready = true
	return nil
}
