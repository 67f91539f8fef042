package strategy

import (
	"errors"
	"fmt"
	"sort"

	tf "github.com/wamuir/graft/tensorflow"
)

// ReducedOutput is an output a step declared with Replica.ReduceOutput: the
// replicas' values of Value, combined by Op.
type ReducedOutput struct {
	Name  string
	Op    ReduceOp
	Value tf.Output
}

// ReducedOutputs collects the outputs one replica declares with
// Replica.ReduceOutput and checks them. Strategies that implement Replica
// keep one per traced replica; model code does not use it.
type ReducedOutputs struct {
	list []ReducedOutput
}

// Declare records a reduced output, or returns an error naming the output
// when its name is empty or already declared, red is neither Sum nor Mean,
// or value has no op.
func (d *ReducedOutputs) Declare(name string, red ReduceOp, value tf.Output) error {
	if name == "" {
		return errors.New("ReduceOutput: empty output name")
	}
	if red != Sum && red != Mean {
		return fmt.Errorf("ReduceOutput %q: reduce op %v, expected strategy.Sum or strategy.Mean", name, red)
	}
	if value.Op == nil {
		return fmt.Errorf("ReduceOutput %q: the value has no op (was it built from a failed scope?)", name)
	}
	for _, o := range d.list {
		if o.Name == name {
			return fmt.Errorf("ReduceOutput %q: declared twice in one step; each reduced output needs its own name", name)
		}
	}
	d.list = append(d.list, ReducedOutput{Name: name, Op: red, Value: value})
	return nil
}

// Check returns an error naming the first reduced output whose name is
// also an output that the step function returned in out.
func (d *ReducedOutputs) Check(out Outputs) error {
	for _, o := range d.List() {
		if _, clash := out[o.Name]; clash {
			return fmt.Errorf("output %q: the step function both returns it and declares it with ReduceOutput; give one of them another name", o.Name)
		}
	}
	return nil
}

// List returns the declared outputs sorted by name: the order in which
// every worker reduces them, whatever order its step declared them in.
func (d *ReducedOutputs) List() []ReducedOutput {
	out := append([]ReducedOutput(nil), d.list...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Reduced returns the value of the output name that the step declared with
// Replica.ReduceOutput: one tensor, already combined across every replica
// of every worker in the step's own run: the single entry of r[name]. It
// returns nil when r has no output name, or when name is a per-replica
// output of several local replicas; of one local replica, it returns that
// replica's own, unreduced value, so ask it for reduced outputs only.
func (r Result) Reduced(name string) *tf.Tensor {
	if v := r[name]; len(v) == 1 {
		return v[0]
	}
	return nil
}
