package collective

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// check compares a peer's frame header with this call's. A difference in
// what the members called the operation with is a *MismatchError.
func (o *op) check(peer int, h *header) error {
	s := &o.self
	switch {
	case h.op != s.op:
		return o.mismatch(peer, h, describeOp)
	case h.dtype != s.dtype || (h.count != s.count && s.op != opAllGather) || !sameShape(s.op, s.dims, h.dims):
		return o.mismatch(peer, h, describeShape)
	case h.red != s.red:
		return o.mismatch(peer, h, describeReduction)
	case h.root != s.root:
		return o.mismatch(peer, h, describeRoot)
	case h.wire != s.wire:
		return o.mismatch(peer, h, describeWire)
	case h.order != s.order:
		return o.mismatch(peer, h, describeOrder)
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

// sameShape reports whether two calls' shapes agree: those both gave, in
// every dimension but an all-gather's first.
func sameShape(op opKind, a, b []uint64) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	if op == opAllGather {
		return len(a) == len(b) && slices.Equal(a[1:], b[1:])
	}
	return slices.Equal(a, b)
}

// describeShape writes a call's tensor as dtype[shape], or dtype[count]
// when the caller gave no shape.
func describeShape(h *header) string {
	if len(h.dims) == 0 {
		return fmt.Sprintf("%v[%d]", h.dtype, h.count)
	}
	dims := make([]string, len(h.dims))
	for i, d := range h.dims {
		dims[i] = strconv.FormatUint(d, 10)
	}
	return fmt.Sprintf("%v[%s]", h.dtype, strings.Join(dims, ","))
}

func describeOp(h *header) string {
	if h.op == opBarrier {
		return "barrier"
	}
	return fmt.Sprintf("%v of %s", h.op, describeShape(h))
}

func describeReduction(h *header) string {
	return fmt.Sprintf("%v of %s", h.red, describeShape(h))
}

func describeOrder(h *header) string {
	if h.order == orderTree {
		return describeReduction(h) + " in tree order"
	}
	return describeReduction(h) + " in rank order"
}

func describeRoot(h *header) string { return fmt.Sprintf("root %d", h.root) }

func describeWire(h *header) string {
	if h.wire == 0 {
		return describeShape(h) + " uncompressed"
	}
	return fmt.Sprintf("%s compressed to %v", describeShape(h), h.wire)
}

// protocolErr reports a frame from peer that cannot follow from a correct
// peer running the same call.
func (o *op) protocolErr(peer int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return o.g.peerError(peer, fmt.Errorf("%w: %s %q: %s", errProtocol, o.self.op, o.name, msg))
}
