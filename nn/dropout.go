package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Dropout zeroes each input element with probability Rate while training
// and scales the rest by 1/(1-Rate); at inference it passes its input on.
// Its masks come from a stateless generator keyed by the layer's seed, the
// replica and a step count the layer keeps (an OnRead variable, saved in
// checkpoints), so a run repeats exactly and a resumed run continues the
// same masks.
type Dropout struct {
	Rate float64
}

// Kind implements Spec.
func (Dropout) Kind() string { return "dropout" }

// Build implements Spec.
func (d Dropout) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if d.Rate < 0 || d.Rate >= 1 {
		return nil, nil, fmt.Errorf("Dropout: Rate %v, expected 0 <= Rate < 1", d.Rate)
	}
	step, err := sc.Variable(name+"/step", tf.Int64, nil, strategy.Zeros(),
		strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationOnlyFirstReplica))
	if err != nil {
		return nil, nil, err
	}
	return &dropout{rate: d.Rate, seed: seed, step: step, in: in}, in, nil
}

type dropout struct {
	rate float64
	seed int64
	step strategy.Variable
	in   []int64
}

func (d *dropout) Vars() []strategy.Variable { return nil }

func (d *dropout) Apply(r strategy.Replica, x tf.Output, training bool) (tf.Output, error) {
	if err := checkInput(x, d.in); err != nil {
		return tf.Output{}, err
	}
	if !training || d.rate == 0 {
		return x, nil
	}
	step, err := r.Read(d.step)
	if err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "dropout")
	key := op.Pack(b.Op(), []tf.Output{b.Const(d.seed<<16 ^ int64(r.ReplicaID())), step})
	// Masks of 16-bit inputs are drawn in float32: bfloat16's 8-bit
	// significand would round the rate.
	udt := x.DataType()
	if isHalf(udt) {
		udt = tf.Float
	}
	u := op.StatelessRandomUniform(b.Op(), op.Shape(b.Op(), x), key, op.StatelessRandomUniformDtype(udt))
	keep := b.Cast(op.GreaterEqual(b.Op(), u, b.Scalar(d.rate, udt)), x.DataType())
	y := b.Mul(b.Mul(x, keep), b.Scalar(1/(1-d.rate), x.DataType()))
	if err := r.Assign(d.step, b.Add(step, b.Const(int64(1)))); err != nil {
		return tf.Output{}, err
	}
	return y, b.Err()
}
