// Package reducedtest runs a step with reduced outputs (Replica.ReduceOutput)
// under any in-graph strategy, for the tests that check them against
// Strategy.Reduce and against the same sums computed in Go.
package reducedtest

import (
	"context"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// Engine is what the check needs of a strategy.
type Engine interface {
	Build(strategy.InputSpec, strategy.ReplicaFn) (strategy.Step, error)
	RunReplicas(context.Context, strategy.Step, []map[string]*tf.Tensor, int) (strategy.Result, error)
	Reduce(context.Context, strategy.ReduceOp, strategy.PerReplica) (*tf.Tensor, error)
	NumLocalReplicas() int
	NumReplicasInSync() int
}

// Spec is the step's input: rows of 3 features.
var Spec = strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1, 3}}}

// Rows is the number of rows each replica gets per step.
const Rows = 2

// Reduced maps each reduced output of Step to the per-replica output it
// reduces and how.
var Reduced = map[string]struct {
	Of string
	Op strategy.ReduceOp
}{
	"loss_sum":  {"loss", strategy.Sum},
	"loss_mean": {"loss", strategy.Mean},
	"cols_sum":  {"cols", strategy.Sum},
	"cols_mean": {"cols", strategy.Mean},
}

// Step returns, per replica, "loss" (the sum of each row, averaged over
// the global batch with AverageLoss) and "cols" (the sum of each column),
// and declares the reduced outputs of Reduced.
func Step(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
	s := r.Scope()
	rows := op.Sum(s.SubScope("rows"), in["x"], op.Const(s.SubScope("rows_axis"), int32(1)))
	out := strategy.Outputs{
		"loss": r.AverageLoss(rows),
		"cols": op.Sum(s.SubScope("cols"), in["x"], op.Const(s.SubScope("cols_axis"), int32(0))),
	}
	for _, name := range []string{"cols_mean", "cols_sum", "loss_mean", "loss_sum"} {
		red := Reduced[name]
		if err := r.ReduceOutput(name, red.Op, out[red.Of]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Input returns the rows global replica g gets at step k: distinct small
// multiples of 1/8, exact in float32.
func Input(g, k int) [][]float32 {
	x := make([][]float32, Rows)
	for i := range x {
		x[i] = make([]float32, 3)
		for j := range x[i] {
			x[i][j] = float32(g*100+k*10+i*3+j) / 8
		}
	}
	return x
}

// Values are one reduced output's value from the step's own run, Reduce
// of the per-replica output it reduces, and the value computed in Go.
type Values struct {
	InRun, Reduce, Want []float32
}

// Run builds Step on e and runs it steps times, replica r of e taking
// Input(firstReplica+r, k) at step k, and returns the last step's Values of
// every reduced output.
func Run(ctx context.Context, e Engine, firstReplica, steps int) (map[string]Values, error) {
	st, err := e.Build(Spec, Step)
	if err != nil {
		return nil, err
	}
	n, total := e.NumLocalReplicas(), e.NumReplicasInSync()
	var res strategy.Result
	for k := range steps {
		feeds := make([]map[string]*tf.Tensor, n)
		for r := range feeds {
			x, err := tf.NewTensor(Input(firstReplica+r, k))
			if err != nil {
				return nil, err
			}
			feeds[r] = map[string]*tf.Tensor{"x": x}
		}
		if res, err = e.RunReplicas(ctx, st, feeds, Rows*total); err != nil {
			return nil, fmt.Errorf("step %d: %w", k, err)
		}
	}
	out := map[string]Values{}
	for _, name := range st.ReducedOutputNames() {
		red := Reduced[name]
		if len(res[name]) != 1 {
			return nil, fmt.Errorf("%s: %d values, expected the one reduced value", name, len(res[name]))
		}
		via, err := e.Reduce(ctx, red.Op, res[red.Of])
		if err != nil {
			return nil, err
		}
		out[name] = Values{InRun: tensorutil.Float32s(res.Reduced(name)), Reduce: tensorutil.Float32s(via),
			Want: want(red.Of, red.Op, total, steps-1)}
	}
	return out, nil
}

// want computes output of (reduced by red) over all total replicas at step
// k in Go.
func want(of string, red strategy.ReduceOp, total, k int) []float32 {
	cols := make([]float64, 3)
	for g := range total {
		for _, row := range Input(g, k) {
			for j, v := range row {
				cols[j] += float64(v)
			}
		}
	}
	var w []float64
	if of == "cols" {
		w = cols
	} else {
		w = []float64{(cols[0] + cols[1] + cols[2]) / float64(Rows*total)}
	}
	out := make([]float32, len(w))
	for i, v := range w {
		if red == strategy.Mean {
			v /= float64(total)
		}
		out[i] = float32(v)
	}
	return out
}
