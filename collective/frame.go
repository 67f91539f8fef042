package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Wire constants. All integers are little-endian.
const (
	frameMagic   uint32 = 0x43444654 // "TFDC"
	frameVersion uint8  = 9          // 2 added kindClosing, 3 the wire type, 4 the upgrade, 5 aligned payloads over shared memory, 6 remote chunks, 7 pushed results, 8 the order, 9 reduce-scatter
	fixedLen            = 64         // bytes of a header before the name
	maxNameLen          = 4096       // longest tensor name
	maxRank             = 32         // most dimensions a shape may have
	maxPayload          = 4 << 20    // largest payload of any frame
)

// frameKind says what a frame carries.
type frameKind uint8

const (
	// kindHello opens a connection (dialer) and accepts it (acceptor). Its
	// seq is the fingerprint, root the sender's rank, count the group size.
	// The acceptor's payload, if any, offers shared memory (upgrade.go).
	kindHello frameKind = iota + 1
	// kindReject refuses a hello; fields as kindHello, payload the reason.
	kindReject
	// kindData carries a chunk of an operation.
	kindData
	// kindAbort breaks the group; payload the encoded error.
	kindAbort
	// kindGoodbye announces an orderly close; EOF follows.
	kindGoodbye
	// kindClosing announces that the sender is closing the group with no
	// operation pending: it starts none but its closing barrier.
	kindClosing
	// kindUpgrade answers a hello that offered shared memory (dialer: root
	// 1 if it sent a segment) and acknowledges the answer (acceptor).
	kindUpgrade
)

// flagRemote marks a data frame whose chunk stays in the sender's memory:
// the payload is a remoteRef (see remote.go), or empty on the frame that
// says the sender has read every chunk it was sent so.
const flagRemote uint8 = 1

// opKind is the collective operation a data frame belongs to.
type opKind uint8

const (
	opAllReduce opKind = iota + 1
	opAllGather
	opBroadcast
	opBarrier
	opReduceScatter
)

func (k opKind) String() string {
	switch k {
	case opAllReduce:
		return "all-reduce"
	case opAllGather:
		return "all-gather"
	case opBroadcast:
		return "broadcast"
	case opBarrier:
		return "barrier"
	case opReduceScatter:
		return "reduce-scatter"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// header is a decoded frame header. Layout (offsets in bytes):
//
//	0 magic u32 | 4 version u8 | 5 kind u8 | 6 op u8 | 7 dtype u8
//	8 reduction u8 | 9 rank u8 | 10 name length u16 | 12 epoch u32
//	16 seq u64 | 24 element count u64 | 32 chunk offset u64 (wire bytes)
//	40 root u32 | 44 step u32 | 48 chunk index u32 | 52 payload length u32
//	56 wire type u8 (0: the dtype itself) | 57 flags u8 | 58 order u8 (0: rank or ring order, 1: tree)
//	59 reserved (5 bytes, sent as zero)
//	64 name, then rank dimensions u64 (the shape, when the caller gave one)
type header struct {
	kind   frameKind
	op     opKind
	dtype  DType
	red    Reduction
	epoch  uint32
	seq    uint64
	count  uint64
	offset uint64
	root   uint32
	step   uint32
	chunk  uint32
	length uint32
	wire   DType // the type data travels as (Compress); 0 for dtype itself
	flags  uint8 // flagRemote, flagPushed or flagArena, on data frames only
	order  uint8 // orderTree: reduce along the tree (InTreeOrder)
	name   []byte
	dims   []uint64 // the tensor's shape; none when the caller gave none
}

// appendHeader appends h's encoding to dst.
func appendHeader(dst []byte, h *header) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint32(dst, frameMagic)
	dst = append(dst, frameVersion, byte(h.kind), byte(h.op), byte(h.dtype), byte(h.red), byte(len(h.dims)))
	dst = le.AppendUint16(dst, uint16(len(h.name)))
	dst = le.AppendUint32(dst, h.epoch)
	dst = le.AppendUint64(dst, h.seq)
	dst = le.AppendUint64(dst, h.count)
	dst = le.AppendUint64(dst, h.offset)
	dst = le.AppendUint32(dst, h.root)
	dst = le.AppendUint32(dst, h.step)
	dst = le.AppendUint32(dst, h.chunk)
	dst = le.AppendUint32(dst, h.length)
	dst = append(dst, byte(h.wire), h.flags, h.order, 0, 0, 0, 0, 0)
	dst = append(dst, h.name...)
	for _, d := range h.dims {
		dst = le.AppendUint64(dst, d)
	}
	return dst
}

// parseFixed decodes the fixed part of a header (len(b) >= fixedLen) and
// returns the length of the name and the number of dimensions that follow.
func parseFixed(b []byte) (header, int, int, error) {
	le := binary.LittleEndian
	var h header
	if m := le.Uint32(b); m != frameMagic {
		return h, 0, 0, fmt.Errorf("%w: bad magic %#08x", errProtocol, m)
	}
	if b[4] != frameVersion {
		return h, 0, 0, fmt.Errorf("%w: version %d, want %d", errProtocol, b[4], frameVersion)
	}
	h.kind, h.op, h.dtype, h.red = frameKind(b[5]), opKind(b[6]), DType(b[7]), Reduction(b[8])
	if h.kind < kindHello || h.kind > kindUpgrade {
		return h, 0, 0, fmt.Errorf("%w: unknown frame kind %d", errProtocol, h.kind)
	}
	nameLen := int(le.Uint16(b[10:]))
	h.epoch, h.seq, h.count = le.Uint32(b[12:]), le.Uint64(b[16:]), le.Uint64(b[24:])
	h.offset, h.root, h.step = le.Uint64(b[32:]), le.Uint32(b[40:]), le.Uint32(b[44:])
	h.chunk, h.length, h.wire, h.flags, h.order = le.Uint32(b[48:]), le.Uint32(b[52:]), DType(b[56]), b[57], b[58]
	if misplacedFlags(&h) {
		return h, 0, 0, fmt.Errorf("%w: flags %#x on a %d frame of %s", errProtocol, h.flags, h.kind, h.op)
	}
	rank := int(b[9])
	if rank > maxRank {
		return h, 0, 0, fmt.Errorf("%w: shape of %d dimensions", errProtocol, rank)
	}
	if nameLen > maxNameLen {
		return h, 0, 0, fmt.Errorf("%w: name of %d bytes", errProtocol, nameLen)
	}
	if h.length > maxPayload {
		return h, 0, 0, fmt.Errorf("%w: payload of %d bytes", errProtocol, h.length)
	}
	return h, nameLen, rank, nil
}

// decodeHeader decodes a whole header from b and returns the bytes it used.
// The name aliases b.
func decodeHeader(b []byte) (header, int, error) {
	if len(b) < fixedLen {
		return header{}, 0, fmt.Errorf("%w: short header (%d bytes)", errProtocol, len(b))
	}
	h, nameLen, rank, err := parseFixed(b)
	if err != nil {
		return h, 0, err
	}
	n := fixedLen + nameLen + 8*rank
	if len(b) < n {
		return h, 0, fmt.Errorf("%w: short name or shape", errProtocol)
	}
	h.name = b[fixedLen : fixedLen+nameLen]
	h.dims = decodeDims(b[fixedLen+nameLen:n], nil)
	return h, n, nil
}

// decodeDims appends the dimensions encoded in b to dst (nil when none).
func decodeDims(b []byte, dst []uint64) []uint64 {
	for i := 0; i+8 <= len(b); i += 8 {
		dst = append(dst, binary.LittleEndian.Uint64(b[i:]))
	}
	return dst
}

// Abort payloads: a code byte, then strings, each a u16 length and bytes.
const (
	abortGeneric  byte = 1 // message
	abortMismatch byte = 2 // op, name, then per member: name, addr, has
	abortTimeout  byte = 3 // op, name, after, detail, then per peer: name, addr
)

// encodeAbort encodes err for an abort frame.
func encodeAbort(err error) []byte {
	var me *MismatchError
	if errors.As(err, &me) {
		return appendStrings([]byte{abortMismatch}, me.Op, me.Name,
			me.Members[0].Name, me.Members[0].Addr, me.Has[0],
			me.Members[1].Name, me.Members[1].Addr, me.Has[1])
	}
	var te *TimeoutError
	if errors.As(err, &te) {
		b := appendStrings([]byte{abortTimeout}, te.Op, te.Name, te.After.String(), te.Detail)
		for _, p := range te.Peers {
			b = appendStrings(b, p.Name, p.Addr)
		}
		return b
	}
	return appendStrings([]byte{abortGeneric}, err.Error())
}

// decodeTimeout rebuilds a *TimeoutError from its abort strings.
func decodeTimeout(s []string) (*TimeoutError, bool) {
	if len(s) < 4 || len(s)%2 != 0 {
		return nil, false
	}
	after, err := time.ParseDuration(s[2])
	if err != nil {
		return nil, false
	}
	e := &TimeoutError{Op: s[0], Name: s[1], After: after, Detail: s[3]}
	for i := 4; i < len(s); i += 2 {
		e.Peers = append(e.Peers, Member{Name: s[i], Addr: s[i+1]})
	}
	return e, true
}

// decodeAbort rebuilds the error a peer aborted the group with.
func decodeAbort(from Member, p []byte) error {
	if len(p) == 0 {
		return &PeerError{Peer: from, Err: fmt.Errorf("%w: empty abort", errProtocol)}
	}
	s, ok := splitStrings(p[1:])
	switch {
	case ok && p[0] == abortMismatch && len(s) == 8:
		return &MismatchError{Op: s[0], Name: s[1],
			Members: [2]Member{{Name: s[2], Addr: s[3]}, {Name: s[5], Addr: s[6]}},
			Has:     [2]string{s[4], s[7]}}
	case ok && p[0] == abortTimeout:
		if e, ok := decodeTimeout(s); ok {
			return e
		}
	case ok && p[0] == abortGeneric && len(s) == 1:
		return &PeerError{Peer: from, Err: &remoteError{msg: s[0]}}
	}
	return &PeerError{Peer: from, Err: fmt.Errorf("%w: malformed abort", errProtocol)}
}

func appendStrings(dst []byte, ss ...string) []byte {
	for _, s := range ss {
		if len(s) > 0xffff {
			s = s[:0xffff]
		}
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

func splitStrings(b []byte) ([]string, bool) {
	var ss []string
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, false
		}
		n := int(binary.LittleEndian.Uint16(b))
		if len(b) < 2+n {
			return nil, false
		}
		ss = append(ss, string(b[2:2+n]))
		b = b[2+n:]
	}
	return ss, true
}

// misplacedFlags reports whether h has more than one flag, an unknown one,
// or one on a frame that cannot carry it: flagRemote goes on the data
// frames of operations that move data, flagPushed and flagArena on those
// of all-reduces.
func misplacedFlags(h *header) bool {
	f := h.flags
	switch {
	case f == 0:
		return false
	case f&(f-1) != 0 || f&^(flagRemote|flagPushed|flagArena) != 0 || h.kind != kindData || h.op == opBarrier:
		return true
	}
	return f != flagRemote && h.op != opAllReduce
}
