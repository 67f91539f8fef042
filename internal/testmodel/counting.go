package testmodel

import (
	"context"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// CountingOps is a CrossDeviceOps that counts, in the graph, the
// reductions of Inner that run: each reduced tensor (each pack, under
// ingraph.Packed) waits for an increment of an int64 counter, the
// strategy's variable Counter, which NewCounter creates. Gathers are not
// counted.
type CountingOps struct {
	Inner strategy.CrossDeviceOps
	// Counter is the counter variable's name.
	Counter string
}

// NewCounter creates the counter of CountingOps named name in sc: an OnRead
// variable that takes replica 0's value, since only replica 0's copy counts.
func NewCounter(sc strategy.Scope, name string) (strategy.Variable, error) {
	return sc.Variable(name, tf.Int64, nil, strategy.Zeros(), strategy.Trainable(false),
		strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationOnlyFirstReplica))
}

// BatchReduce implements strategy.CrossDeviceOps.
func (c CountingOps) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	out, err := c.Inner.BatchReduce(s, red, values, devices)
	if err != nil {
		return nil, err
	}
	// The in-graph engine names replica r's copy of a variable v by
	// "v/replica_r" on its device; replica 0 of this process is global
	// replica 0 when the process runs every replica.
	cs := s.SubScope("count").WithDevice(devices[0])
	h := op.VarHandleOp(cs.SubScope("handle"), tf.Int64, tf.ScalarShape(), op.VarHandleOpSharedName(c.Counter+"/replica_0"))
	for k := range out[0] {
		inc := op.AssignAddVariableOp(cs.SubScope(fmt.Sprintf("add_%d", k)), h, op.Const(cs.SubScope(fmt.Sprintf("one_%d", k)), int64(1)))
		for r := range out {
			out[r][k] = op.Identity(s.SubScope(fmt.Sprintf("counted_%d_%d", k, r)).WithDevice(devices[r]).WithControlDependencies(inc), out[r][k])
		}
	}
	return out, s.Err()
}

// BatchGather implements strategy.CrossDeviceOps.
func (c CountingOps) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return c.Inner.BatchGather(s, values, devices)
}

// Copier reads every local copy of a variable: the in-graph strategies.
type Copier interface {
	Copies(ctx context.Context, v strategy.Variable) ([]*tf.Tensor, error)
	Variables() []strategy.Variable
}

// DifferingCopies returns the names of the OnWrite variables of e, which a
// synchronous strategy keeps in sync, whose local copies are not all
// bit-identical.
func DifferingCopies(ctx context.Context, e Copier) ([]string, error) {
	var differ []string
	for _, v := range e.Variables() {
		if v.Synchronization() != strategy.OnWrite {
			continue
		}
		copies, err := e.Copies(ctx, v)
		if err != nil {
			return nil, err
		}
		for r := 1; r < len(copies); r++ {
			if fmt.Sprint(tensorutil.Value(copies[r])) != fmt.Sprint(tensorutil.Value(copies[0])) {
				differ = append(differ, v.Name())
				break
			}
		}
	}
	return differ, nil
}

// CountAfterRuns is a Plan.AfterRuns that appends the value of counter, a
// CountingOps counter of e, to counts.
func CountAfterRuns(ctx context.Context, e Engine, counter strategy.Variable, counts *[]int64) func(int) error {
	return func(int) error {
		c, err := e.Value(ctx, counter)
		if err != nil {
			return err
		}
		*counts = append(*counts, tensorutil.Value(c).(int64))
		return nil
	}
}

// Deltas returns what each run added to counts taken after Build and
// after every run.
func Deltas(counts []int64) []int64 {
	var d []int64
	for i := 1; i < len(counts); i++ {
		d = append(d, counts[i]-counts[i-1])
	}
	return d
}

// AppliedEvery returns what runs runs of a step that accumulates k
// micro-steps add to a count when the run that applies adds n and the
// others none.
func AppliedEvery(k, runs int, n int64) []int64 {
	d := make([]int64, runs)
	for i := k - 1; i < runs; i += k {
		d[i] = n
	}
	return d
}
