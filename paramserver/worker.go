package paramserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/taskserver"
)

// workerGraph is one worker's graph: its copy of every Function, and its
// handles of the variables' shards and the optimizers' slots.
// It is built under Strategy.mu and read by the worker's loop.
type workerGraph struct {
	index  int // position among the workers
	task   cluster.Task
	addr   string
	device string // the worker's CPU:0
	sess   *planSession

	graph    *tf.Graph
	scopes   map[string]int
	handles  map[resource]tf.Output
	progress tf.Output
}

func (w *workerGraph) newScope(name string) *op.Scope { return newScope(w.graph, w.scopes, name) }

// buildBasics adds the handle of the step counter.
func (w *workerGraph) buildBasics(s *Strategy, workers int) error {
	sc := w.newScope("basics")
	w.progress = op.VarHandleOp(sc.SubScope("progress").WithDevice(s.ps[0]), tf.Int64, tf.MakeShape(int64(1+workers)),
		op.VarHandleOpSharedName(progressName))
	return sc.Err()
}

// handle returns the graph's handle of r, creating it on first use.
func (w *workerGraph) handle(r resource) tf.Output {
	if h, ok := w.handles[r]; ok {
		return h
	}
	device, shared := r.placement()
	sc := w.newScope("ps_var/" + r.Name())
	h := op.VarHandleOp(sc.WithDevice(device), r.DType(), tf.MakeShape(r.Shape()...), op.VarHandleOpSharedName(shared))
	w.handles[r] = h
	return h
}

// psFailure reports the position of the ps task err shows failed, with the
// evidence, or -1: a ps task that a run could not reach and that the chief
// cannot reach either, or one that restarted, and so lost the variables it
// was given.
func (s *Strategy) psFailure(ctx context.Context, err error) (int, error) {
	var re *partition.RunError
	if !errors.As(err, &re) {
		return -1, nil
	}
	k := slices.IndexFunc(s.psTasks, func(t cluster.Task) bool { return taskName(t) == re.Task })
	switch {
	case k < 0:
		return -1, nil
	case errors.Is(err, taskserver.ErrRestarted):
		return k, fmt.Errorf("it restarted, and no longer holds its variables: %w", err)
	case !errors.Is(err, taskserver.ErrUnavailable):
		return -1, nil
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, perr := s.clients.clients[re.Task].Ping(pctx); perr != nil {
		return k, fmt.Errorf("it no longer answers (%v) after: %w", perr, err)
	}
	return -1, nil
}
