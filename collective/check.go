package collective

import "fmt"

// check compares a peer's frame header with this call's. A difference in
// what the members called the operation with is a *MismatchError.
func (o *op) check(peer int, h *header) error {
	s := &o.self
	switch {
	case h.op != s.op:
		return o.mismatch(peer, h, describeOp)
	case h.dtype != s.dtype || (h.count != s.count && s.op != opAllGather):
		return o.mismatch(peer, h, describeShape)
	case h.red != s.red:
		return o.mismatch(peer, h, describeReduction)
	case h.root != s.root:
		return o.mismatch(peer, h, describeRoot)
	}
	return nil
}

func (o *op) mismatch(peer int, h *header, describe func(*header) string) error {
	e := &MismatchError{Op: o.self.op.String(), Name: o.name}
	a, b := o.g.rank, peer
	ha, hb := &o.self, h
	if a > b {
		a, b, ha, hb = b, a, hb, ha
	}
	e.Members = [2]Member{o.g.members[a], o.g.members[b]}
	e.Has = [2]string{describe(ha), describe(hb)}
	return e
}

func describeShape(h *header) string { return fmt.Sprintf("%v[%d]", h.dtype, h.count) }

func describeOp(h *header) string {
	if h.op == opBarrier {
		return "barrier"
	}
	return fmt.Sprintf("%v of %s", h.op, describeShape(h))
}

func describeReduction(h *header) string {
	return fmt.Sprintf("%v of %s", h.red, describeShape(h))
}

func describeRoot(h *header) string { return fmt.Sprintf("root %d", h.root) }

// protocolErr reports a frame from peer that cannot follow from a correct
// peer running the same call.
func (o *op) protocolErr(peer int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return o.g.peerError(peer, fmt.Errorf("%w: %s %q: %s", errProtocol, o.self.op, o.name, msg))
}
