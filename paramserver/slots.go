package paramserver

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// slotDevice returns where a slot variable of w's store must live: on the
// ps of the shard it serves, or ps 0 for a non-slot variable.
func (w *workerGraph) slotDevice(s *Strategy) func(strategy.SlotInfo) string {
	return func(info strategy.SlotInfo) string {
		if info.Primary != nil {
			for sh, v := range w.views {
				if v == info.Primary {
					return sh.device
				}
			}
		}
		return s.ps[0]
	}
}

// view0 returns the shard as an optimizer sees it in the chief's graph.
func (s *Strategy) view0(sh *shard) (strategy.Variable, error) {
	if v, ok := s.views0[sh]; ok {
		return v, nil
	}
	v, err := strategy.NewExternalVariable(sh.viewName(), sh.v.dtype, sh.shape(), sh.h0, strategy.Trainable(sh.v.trainable))
	if err != nil {
		return nil, err
	}
	s.views0[sh] = v
	return v, nil
}

// prepareSlots creates, in the chief's graph, the slot variables opt keeps
// for the shards dense — by building, once, an update of them from
// placeholder gradients that never runs — and schedules their
// initialisation. Workers' graphs create the same variables (same names, so
// the same resources on the same ps tasks) but never initialise them.
func (s *Strategy) prepareSlots(opt strategy.Optimizer, dense []*shard) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%p", opt)
	for _, sh := range dense {
		fmt.Fprintf(&b, ",%p", sh)
	}
	key := b.String()
	if s.prepared[key] {
		return nil
	}
	sc := s.newScope0("slots")
	views := make([]strategy.Variable, len(dense))
	grads := make([]tf.Output, len(dense))
	for i, sh := range dense {
		var err error
		if views[i], err = s.view0(sh); err != nil {
			return err
		}
		grads[i] = op.Placeholder(sc.SubScope(fmt.Sprintf("grad_%d", i)), sh.v.dtype, op.PlaceholderShape(tf.MakeShape(sh.shape()...)))
	}
	ac, err := s.store0.ApplyContext(sc.SubScope("apply"))
	if err != nil {
		return err
	}
	if err := safely(func() error { _, err := opt.Apply(ac, grads, views); return err }); err != nil {
		return fmt.Errorf("Minimize: optimizer: %w", err)
	}
	infos := s.store0.Slots()
	for i, info := range infos[s.known0:] {
		var owner *shard
		if info.Primary != nil {
			for sh, v := range s.views0 {
				if v == info.Primary {
					owner = sh
				}
			}
		}
		part := &slotPart{h0: info.Var.Handle(0), device: s.ps[0], shards: 1}
		sv := &slotVar{name: info.Var.Name(), dtype: info.Var.DType(), full: info.Var.Shape()}
		if owner != nil {
			part.device, part.offset, part.rows, part.shards = owner.device, owner.offset, owner.rows, len(owner.v.shards)
			sv.name = owner.v.name + "/" + info.Owner + "/" + info.Slot
			sv.full = append([]int64(nil), owner.v.shape...)
		}
		op.ReadVariableOp(sc.SubScope(fmt.Sprintf("pin_%d", i)).WithDevice(part.device), part.h0, info.Var.DType())
		if have, ok := s.slots[sv.name]; ok {
			sv = have
		} else {
			s.slots[sv.name] = sv
			s.slotList = append(s.slotList, sv)
		}
		sv.parts = append(sv.parts, part)
		s.pending = append(s.pending, pendingInit{op: info.Init, done: func() { part.inited = true }, inited: func() bool { return part.inited }})
	}
	s.known0 = len(infos)
	if err := sc.Err(); err != nil {
		return err
	}
	s.prepared[key] = true
	return nil
}
