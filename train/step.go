package train

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/strategy"
)

// TrainStep is a custom training step, as a Keras user overrides
// train_step: for one replica's batch it computes the predictions and
// the loss and applies the gradients (through c, or with its own
// Minimize), and returns the loss (the replica's share, as Minimize takes
// it) and the predictions, which Fit logs and scores with the metrics.
type TrainStep func(r strategy.Replica, in strategy.Inputs, c *StepContext) (loss, yPred tf.Output, err error)

// StepContext is what a step sees of the compiled model: its inputs, the
// model, the loss and the optimizer.
type StepContext struct {
	t  *Trainer
	k  keys
	in strategy.Inputs
}

// Model returns the compiled model.
func (c *StepContext) Model() *nn.Model { return c.t.model }

// Optimizer returns the compiled optimizer.
func (c *StepContext) Optimizer() strategy.Optimizer { return c.t.opt }

// Inputs returns the model's inputs from the batch, in the model's order.
func (c *StepContext) Inputs() []tf.Output {
	xs := make([]tf.Output, len(c.k.inputs))
	for i, key := range c.k.inputs {
		xs[i] = c.in[key]
	}
	return xs
}

// Labels returns the batch's labels.
func (c *StepContext) Labels() tf.Output { return c.in[KeyY] }

// Predict runs the model on the batch's inputs.
func (c *StepContext) Predict(r strategy.Replica, training bool) (tf.Output, error) {
	ys, err := c.t.model.Outputs(r, c.Inputs(), training)
	if err != nil {
		return tf.Output{}, err
	}
	return ys[0], nil
}

// Loss returns the compiled loss of yPred against the batch's labels, as
// the replica's share of the global step's mean: each example's loss is
// the mean of its elements, times its sample weight if the batch has
// them, and the sum of the replica's examples is divided by the examples
// of the whole step (Replica.AverageLoss), so that the replicas' shares
// add up to the mean loss of the global batch — with a partial last batch
// too.
func (c *StepContext) Loss(r strategy.Replica, yPred tf.Output) (tf.Output, error) {
	s := r.Scope().SubScope("loss")
	v, err := c.t.loss.Call(s.SubScope(c.t.loss.Name()), c.in[KeyY], yPred)
	if err != nil {
		return tf.Output{}, fmt.Errorf("loss %s: %w", c.t.loss.Name(), err)
	}
	b := nn.NewBuilder(s, "per_example")
	per := perExample(b, b.Cast(v, tf.Float))
	if c.k.weight {
		w := op.Reshape(b.Op(), b.Cast(c.in[KeySampleWeight], tf.Float), b.Const([]int32{-1}))
		per = b.Mul(per, w)
	}
	if err := b.Err(); err != nil {
		return tf.Output{}, fmt.Errorf("loss %s: %w", c.t.loss.Name(), err)
	}
	return r.AverageLoss(per), nil
}

// Minimize applies the gradients of loss to the model's trainable
// variables with the compiled optimizer.
func (c *StepContext) Minimize(r strategy.Replica, loss tf.Output) error {
	return r.Minimize(c.t.opt, loss, c.t.model.Vars(), c.t.cfg.minimize...)
}

// defaultTrain is Keras's train_step: predict, loss, minimize.
func (c *StepContext) defaultTrain(r strategy.Replica) (loss, yPred tf.Output, err error) {
	if yPred, err = c.Predict(r, true); err != nil {
		return
	}
	if loss, err = c.Loss(r, yPred); err != nil {
		return
	}
	return loss, yPred, c.Minimize(r, loss)
}
