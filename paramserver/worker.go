package paramserver

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/probe"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// workerGraph is one worker's graph: its copy of every Function, and its
// handles of the variables' shards and the optimizers' slots.
// It is built under Strategy.mu and read by the worker's loop.
type workerGraph struct {
	index  int // position among the workers
	task   cluster.Task
	addr   string
	target string
	device string // the worker's CPU:0

	graph    *tf.Graph
	scopes   map[string]int
	handles  map[resource]tf.Output
	progress tf.Output
	probe    tf.Output
}

func (w *workerGraph) newScope(name string) *op.Scope { return newScope(w.graph, w.scopes, name) }

// buildBasics adds the probe op (a constant computed on the worker) and the
// handle of the step counter.
func (w *workerGraph) buildBasics(s *Strategy, workers int) error {
	sc := w.newScope("basics")
	w.probe = op.Identity(sc.SubScope("probe").WithDevice(w.device), op.Const(sc.SubScope("one").WithDevice(w.device), int32(1)))
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

// dial reports whether the TensorFlow server at addr accepts connections
// within timeout, leaving no socket open on it (probe.Server): the
// coordinator's heartbeat dials a worker every half second of a step.
func dial(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return probe.Server(ctx, addr)
}

var psDevice = regexp.MustCompile(`/job:ps/replica:0/task:(\d+)`)

// psFailure reports the position of the ps task err shows failed, with the
// evidence, or -1: a ps task that no longer accepts connections after an
// error of the kind a dead peer causes, or one that no longer has the
// variables it was given (it restarted).
func (s *Strategy) psFailure(err error) (int, error) {
	var te *tfrt.Error
	if !errors.As(err, &te) {
		return -1, nil
	}
	switch te.Code {
	case tfrt.Unavailable, tfrt.Aborted, tfrt.DeadlineExceeded, tfrt.Cancelled, tfrt.Unknown, tfrt.Internal:
		for k, t := range s.psTasks {
			addr, _ := s.spec.TaskAddress(t.Type, t.Index)
			if derr := dial(context.Background(), addr, time.Second); derr != nil {
				return k, fmt.Errorf("it no longer accepts connections (%v) after: %w", derr, err)
			}
		}
	case tfrt.NotFound, tfrt.FailedPrecondition:
		msg := te.Msg
		lost := strings.Contains(msg, "Resource") || strings.Contains(msg, "resource") ||
			strings.Contains(msg, "uninitialized") || strings.Contains(msg, "Container")
		if m := psDevice.FindStringSubmatch(msg); m != nil && lost {
			idx, _ := strconv.Atoi(m[1])
			for k, t := range s.psTasks {
				if t.Index == idx {
					return k, fmt.Errorf("it answers but no longer holds its variables (restarted?): %w", err)
				}
			}
		}
	}
	return -1, nil
}
