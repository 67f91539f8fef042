package savedmodel

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// replica is the strategy.Replica a signature's Fn runs with: one replica
// with no device, reading the exported variables. Calls that would train
// or change the model fail the export.
type replica struct {
	g     *graph
	sig   string
	scope *op.Scope
	reads map[strategy.Variable]tf.Output
	err   error // of a call that cannot return one
}

var _ strategy.Replica = (*replica)(nil)

func (r *replica) Scope() *op.Scope       { return r.scope }
func (r *replica) ReplicaID() int         { return 0 }
func (r *replica) NumReplicasInSync() int { return 1 }
func (r *replica) AddTarget(o *tf.Operation) {
	r.fail(fmt.Errorf("AddTarget %s: a signature runs only what its outputs need", o.Name()))
}

func (r *replica) Read(v strategy.Variable) (tf.Output, error) {
	if out, ok := r.reads[v]; ok {
		return out, nil
	}
	h, err := r.g.handle(v, r.sig)
	if err != nil {
		return tf.Output{}, err
	}
	out := op.ReadVariableOp(r.scope.SubScope("read"), h, v.DType())
	r.reads[v] = out
	return out, r.scope.Err()
}

func (r *replica) Lookup(v strategy.Variable, ids tf.Output) (tf.Output, error) {
	val, err := r.Read(v)
	if err != nil {
		return tf.Output{}, err
	}
	return graphutil.LookupRows(r.scope.SubScope("lookup"), v.Name(), v.Shape(), val, ids)
}

// AverageLoss returns sum(perExample) / the batch's examples (its leading
// dimension), as the contract says: the batch is the one replica's.
func (r *replica) AverageLoss(perExample tf.Output) tf.Output {
	s := r.scope.SubScope("average_loss")
	n := op.Slice(s.SubScope("n"), op.Shape(s.SubScope("shape"), perExample), op.Const(s.SubScope("begin"), []int32{0}), op.Const(s.SubScope("size"), []int32{1}))
	n = op.Cast(s.SubScope("float"), op.Reshape(s.SubScope("scalar"), n, op.Const(s.SubScope("scalar_shape"), []int32{})), tf.Float)
	return graphutil.AverageLoss(s, perExample, n)
}

func (r *replica) Minimize(strategy.Optimizer, tf.Output, []strategy.Variable, ...strategy.MinimizeOption) error {
	return fmt.Errorf("Minimize: a signature computes outputs; it does not train")
}

func (r *replica) Gradients(tf.Output, []strategy.Variable) ([]tf.Output, error) {
	return nil, fmt.Errorf("Gradients: a signature computes outputs; it does not train")
}

func (r *replica) ApplyGradients(strategy.Optimizer, []tf.Output, []strategy.Variable, ...strategy.MinimizeOption) error {
	return fmt.Errorf("ApplyGradients: a signature computes outputs; it does not train")
}

// AllReduce returns value: combined across one replica, it is itself.
func (r *replica) AllReduce(_ strategy.ReduceOp, value tf.Output) (tf.Output, error) {
	return value, nil
}

// AllGather returns value, the only replica's.
func (r *replica) AllGather(value tf.Output) (tf.Output, error) { return value, nil }

func (r *replica) Assign(v strategy.Variable, _ tf.Output) error { return r.writes("Assign", v) }

func (r *replica) AssignAdd(v strategy.Variable, _ tf.Output) error {
	return r.writes("AssignAdd", v)
}

func (r *replica) ReduceOutput(name string, _ strategy.ReduceOp, _ tf.Output) error {
	return fmt.Errorf("ReduceOutput %q: a signature's outputs are those its Fn returns", name)
}

func (r *replica) writes(call string, v strategy.Variable) error {
	name := "<nil>"
	if v != nil {
		name = v.Name()
	}
	return fmt.Errorf("%s %q: a signature must not change the model (build it in inference mode)", call, name)
}

func (r *replica) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}
