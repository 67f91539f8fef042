package ingraph

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// applyContext is the in-graph engine's ApplyContext: one replica's copies,
// and slot variables mirrored like the variables they serve.
type applyContext struct {
	e       *Engine
	scope   *op.Scope
	replica int
}

var _ strategy.ApplyContext = (*applyContext)(nil)

// Scope returns a scope pinned to the replica's device.
func (ac *applyContext) Scope() *op.Scope { return ac.scope }

// Handle returns the replica's copy of v. v must be a variable of the
// engine (the optimizer is given only those).
func (ac *applyContext) Handle(v strategy.Variable) tf.Output {
	return v.(*variable).handles[ac.replica]
}

// Slot returns the slot variable named slot that owner keeps for v,
// creating it on first use with init: one copy per replica, checkpointed as
// "<v>/<owner>/<slot>".
func (ac *applyContext) Slot(owner string, vv strategy.Variable, slot string, init strategy.Initializer) (strategy.Variable, error) {
	v, ok := vv.(*variable)
	if !ok {
		return nil, fmt.Errorf("slot %q of %v: the variable was not created in this strategy's scope", slot, vv)
	}
	return ac.slot(slotKey{owner: owner, v: v, slot: slot}, fmt.Sprintf("%s/%s/%s", v.name, owner, slot), v.dtype, v.shape, init)
}

// NonSlot returns a variable the optimizer keeps once rather than per
// variable (its step count, say), named "<owner>/<name>", creating it on
// first use.
func (ac *applyContext) NonSlot(owner, name string, dtype tf.DataType, shape []int64, init strategy.Initializer) (strategy.Variable, error) {
	return ac.slot(slotKey{owner: owner, slot: name}, owner+"/"+name, dtype, shape, init)
}

func (ac *applyContext) slot(key slotKey, name string, dtype tf.DataType, shape []int64, init strategy.Initializer) (strategy.Variable, error) {
	v, err := ac.e.slotVariable(key, name, dtype, shape, init)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// slotVariable returns the variable key names, which the engine creates
// on first use, not trainable, with init and opts: an optimizer's slot,
// or an accumulator. e.mu is held.
func (e *Engine) slotVariable(key slotKey, name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (*variable, error) {
	if s, ok := e.slots[key]; ok {
		return s, nil
	}
	s, err := e.newVariable(name, dtype, shape, init, append([]strategy.VariableOption{strategy.Trainable(false)}, opts...)...)
	if err != nil {
		return nil, err
	}
	e.slots[key] = s
	return s, nil
}
