package collective

import "fmt"

// DType is the element type of a buffer an operation combines.
type DType uint8

// The element types the engine reduces.
const (
	Float32 DType = iota + 1
	Float64
	Float16
	BFloat16
	Int32
	Int64
	// Int8 sums wrap around on overflow, as Go's int8 does. As a wire type
	// (Compress), it quantizes a float32 sum or mean.
	Int8
)

// Size returns the bytes of one element (0 for an unknown type).
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case Float16, BFloat16:
		return 2
	case Int8:
		return 1
	}
	return 0
}

// String returns the type's name, as TensorFlow spells it.
func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Int8:
		return "int8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Reduction combines the members' buffers element by element.
type Reduction uint8

// The reductions of AllReduce.
const (
	Sum Reduction = iota + 1
	// Mean is the sum divided by the group's size (truncated for integers).
	Mean
	Min
	Max
)

// String returns the reduction's name.
func (r Reduction) String() string {
	switch r {
	case Sum:
		return "sum"
	case Mean:
		return "mean"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduction(%d)", uint8(r))
}

// Member is one process of a group.
type Member struct {
	// Name names the member in errors and logs, e.g. "worker:1".
	Name string
	// Addr is the host:port the member listens on.
	Addr string
}

func (m Member) String() string { return fmt.Sprintf("%s (%s)", m.Name, m.Addr) }

// CallOption describes one call of an operation further.
type CallOption func(*header)

// Shape gives the tensor's shape, which every member's call must agree on
// (all but the first dimension, for AllGather): a call whose shape differs
// fails on every member with a *MismatchError naming both shapes. Without
// it, members compare only dtypes and element counts. At most 32
// dimensions.
func Shape(dims ...int64) CallOption {
	return func(h *header) {
		h.dims = make([]uint64, len(dims))
		for i, d := range dims {
			h.dims[i] = uint64(d)
		}
	}
}

// Compress sends a Float32 all-reduce's data over the wire as wire
// (Float16 or BFloat16), halving the bytes sent: every member converts
// what it sends to wire's 16 bits, rounding to nearest even, and converts
// what it receives back to float32, reducing in float32 at every hop.
// Precision is lost once per transfer, never accumulated in 16 bits, and
// every member still ends with the same bits. Float16 overflows to
// infinity beyond 65504; BFloat16 keeps float32's range with 8 bits of
// precision. Every member's call must compress to the same type, or none:
// a call that differs fails on every member with a *MismatchError. Other
// dtypes, operations and wire types are errors; Compress(0) sends the data
// as it is. Where the members' results lie in memory they all map (see
// "Pushed results" in the package doc), nothing crosses a wire and the
// call moves float32: its result is exact.
//
// Compress(Int8) sends a Float32 Sum or Mean as int8, about a quarter
// of its bytes, each block of 256 elements in units of a largest
// magnitude in it. Up to the direct path's size (256 KiB of int8 by
// default), one all-gather sends every member each member's blocks
// rounded to ±127 levels of its own maxima, with them, and every member
// adds them all in float32, in rank order: one round trip, and an element
// of the sum within n/2 levels of the largest maximum (n members). A
// larger buffer takes two all-reduces, one that agrees on each block's
// maximum on any member (a 256th of float32's bytes), then the members'
// blocks rounded to ±127/n levels of it summed around the ring in int8,
// exactly: the ring's bytes, and an element within n/2 of those coarser
// levels; groups of more than 127 members, whose members would have no
// level there, are refused. Either way every member ends with the same
// bits, and a block whose maximum is not finite sums to NaN. Unlike the
// 16-bit types, Int8 quantizes where memory is shared too.
func Compress(wire DType) CallOption { return func(h *header) { h.wire = wire } }

// orderTree is header.order for InTreeOrder.
const orderTree = 1

// InTreeOrder makes an all-reduce combine the members' buffers along one
// binary tree over the members in rank order, the same for every size:
// the members [lo, hi) are the combination of [lo, mid) and [mid, hi),
// mid = lo + (hi-lo)/2, down to single members. With a power-of-two
// number of members each holding the tree's combination of an aligned
// block of a larger power-of-two tree's leaves (say 8 leaves over 1, 2, 4
// or 8 members), the result is that larger tree's, bit for bit, whatever
// the number of members: the grouping of additions, not their operands'
// order, changes floating-point sums. Up to 256 KiB every member sends
// its buffer to every other; larger buffers move the ring's bytes, each
// member combining the members' parts of one segment and sending the
// result to all. Compression is refused.
func InTreeOrder() CallOption { return func(h *header) { h.order = orderTree } }

// withOptions applies opts to h and checks the result.
func withOptions(h header, opts []CallOption) (header, error) {
	for _, o := range opts {
		o(&h)
	}
	if len(h.dims) > maxRank {
		return h, fmt.Errorf("shape of %d dimensions (at most %d)", len(h.dims), maxRank)
	}
	n := uint64(1)
	for _, d := range h.dims {
		n *= d
	}
	if len(h.dims) > 0 && n != h.count {
		return h, fmt.Errorf("shape %v has %d elements, the buffer %d", h.dims, n, h.count)
	}
	if h.order == orderTree && (h.op != opAllReduce || h.wire != 0) {
		return h, fmt.Errorf("InTreeOrder: only uncompressed all-reduces combine in tree order")
	}
	sums := h.red == Sum || h.red == Mean
	allReduces := h.op == opAllReduce && (h.wire.Size() == 2 || h.wire == Int8 && sums)
	scatters := h.op == opReduceScatter && h.wire == Int8 && sums
	if h.wire != 0 && (h.dtype != Float32 || !allReduces && !scatters) {
		return h, fmt.Errorf("cannot compress %v to %v: only float32 all-reduces compress, to float16 or bfloat16, or, summing or averaging, to int8, and reduce-scatters to int8", h.dtype, h.wire)
	}
	return h, nil
}
