package paramserver

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// resource is a resource variable on a ps task that an optimizer updates:
// a shard of a model variable, or an optimizer's slot or non-slot
// variable. Every graph addresses it by its shared name on its device.
type resource interface {
	strategy.Variable
	// placement returns the device and the VarHandleOp's shared_name.
	placement() (device, shared string)
}

// applyContext is the parameter-server strategy's ApplyContext: it updates
// shards on their ps tasks from one graph (a worker's), with each slot
// variable beside the shard it serves and each non-slot variable on the
// first ps task.
type applyContext struct {
	s      *Strategy
	scope  *op.Scope
	handle func(resource) tf.Output // the graph's handle of a resource
}

var _ strategy.ApplyContext = (*applyContext)(nil)

func (ac *applyContext) Scope() *op.Scope { return ac.scope }

// Handle returns the graph's handle of v, a shard or a slot: the optimizer
// is given only those.
func (ac *applyContext) Handle(v strategy.Variable) tf.Output {
	r, ok := v.(resource)
	if !ok {
		return tf.Output{}
	}
	return ac.handle(r)
}

func (ac *applyContext) Slot(owner string, v strategy.Variable, slot string, init strategy.Initializer) (strategy.Variable, error) {
	sh, ok := v.(*shard)
	if !ok {
		return nil, fmt.Errorf("slot %q of %v: the variable is not a shard of this strategy", slot, v)
	}
	return ac.s.slot(slotKey{owner: owner, sh: sh, slot: slot}, sh.v.dtype, sh.shape(), init)
}

func (ac *applyContext) NonSlot(owner, name string, dtype tf.DataType, shape []int64, init strategy.Initializer) (strategy.Variable, error) {
	return ac.s.slot(slotKey{owner: owner, slot: name}, dtype, shape, init)
}

// slotKey identifies a slot variable: its optimizer, the shard it serves
// (nil for a non-slot variable) and its name.
type slotKey struct {
	owner string
	sh    *shard
	slot  string
}

// slot returns the slot variable key names, creating it on first use in the
// chief's graph, on the device of the shard it serves (the first ps task
// for a non-slot variable), with its initialiser pending. Other graphs
// address it by its shared name. s.mu is held.
func (s *Strategy) slot(key slotKey, dtype tf.DataType, shape []int64, init strategy.Initializer) (*slotPart, error) {
	if p, ok := s.slotParts[key]; ok {
		return p, nil
	}
	logical, full := key.owner+"/"+key.slot, shape
	p := &slotPart{name: logical, dtype: dtype, shape: append([]int64(nil), shape...), device: s.ps[0], shards: 1}
	if sh := key.sh; sh != nil {
		logical, full = sh.v.name+"/"+key.owner+"/"+key.slot, sh.v.shape
		p.name = sh.viewName() + "/" + key.owner + "/" + key.slot
		p.device, p.offset, p.rows, p.shards = sh.device, sh.offset, sh.rows, len(sh.v.shards)
	}
	p.shared = "ps_slot/" + p.name
	sc := s.newScope0("slot/" + p.name)
	err := graphutil.Safely(func() error {
		ds := sc.WithDevice(p.device)
		p.h0 = op.VarHandleOp(ds, dtype, tf.MakeShape(shape...), op.VarHandleOpSharedName(p.shared))
		val, err := init.Build(ds.SubScope("initial_value"), dtype, shape)
		if err != nil {
			return err
		}
		p.init = op.AssignVariableOp(ds.SubScope("init"), p.h0, val)
		return sc.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("slot variable %q: %w", p.name, err)
	}
	s.slotParts[key] = p
	sv, ok := s.slots[logical]
	if !ok {
		sv = &slotVar{name: logical, dtype: dtype, full: append([]int64(nil), full...)}
		s.slots[logical] = sv
		s.slotList = append(s.slotList, sv)
	}
	sv.parts = append(sv.parts, p)
	s.pending = append(s.pending, pendingInit{op: p.init, done: func() { p.inited = true }, inited: func() bool { return p.inited }})
	return p, nil
}

// A shard is a Variable for optimizers: named after its variable (and its
// part), of the shard's shape.

func (sh *shard) Name() string                                { return sh.viewName() }
func (sh *shard) DType() tf.DataType                          { return sh.v.dtype }
func (sh *shard) Shape() []int64                              { return sh.shape() }
func (sh *shard) Trainable() bool                             { return sh.v.trainable }
func (sh *shard) Synchronization() strategy.Synchronization   { return strategy.OnWrite }
func (sh *shard) Aggregation() strategy.Aggregation           { return strategy.AggregationNone }
func (sh *shard) placement() (string, string)                 { return sh.device, sh.shared }
func (p *slotPart) Name() string                              { return p.name }
func (p *slotPart) DType() tf.DataType                        { return p.dtype }
func (p *slotPart) Shape() []int64                            { return append([]int64(nil), p.shape...) }
func (p *slotPart) Trainable() bool                           { return false }
func (p *slotPart) Synchronization() strategy.Synchronization { return strategy.OnWrite }
func (p *slotPart) Aggregation() strategy.Aggregation         { return strategy.AggregationNone }
func (p *slotPart) placement() (string, string)               { return p.device, p.shared }
