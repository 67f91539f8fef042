// Package collective is tfdist's cross-worker collective engine: all-reduce,
// all-gather, broadcast and barrier over TCP between the processes of a
// group, and over shared memory between those on one host, in pure Go.
//
// # Group
//
// New forms a group from a list of members (name and host:port) and this
// process's rank. Members connect as a full mesh: member i dials every
// j < i, retrying with backoff until the startup timeout, and accepts the
// others. Each connection opens with a hello exchange (magic, protocol
// version, fingerprint, epoch, rank, group size). A peer started with a
// different fingerprint, epoch or size is rejected and New fails on both
// sides naming the other member; a peer that never arrives makes New fail
// at the startup timeout naming every missing member. The listener keeps
// running after New: connections from hosts that are not members, that do
// not speak the protocol (bad magic or version, an HTTP request, silence
// for 10s) or that arrive after the group formed are refused and logged
// (zap Warn with the remote address) without disturbing the group.
//
// # Shared memory
//
// On Linux, members on one host move their frames from the loopback TCP
// connection to shared memory once it is set up (WithSharedMemory, on by
// default), as MPI and NCCL do: a frame is then copied into a ring in
// user space, with no system call or kernel copy on the data path, and a
// ring all-reduce's reader reduces (or copies) each payload from where it
// lies in the ring straight into the result. Each side maps every ring
// twice in a row, so that any frame is contiguous in its memory, and the
// sender pads a data frame's header so that its payload starts at a
// multiple of 8 bytes. The connection still opens over TCP, with TLS when the group uses
// it, and the hello; the acceptor's hello then offers a random nonce and
// the name of its abstract Unix socket, which only processes in its network
// namespace can reach. A dialer that reaches it creates the segment (a
// sealed memfd: one byte ring per direction and their counters) and four
// eventfds, sends them with the nonce (SCM_RIGHTS), and says so in an
// upgrade frame over TCP; the acceptor takes the segment its nonce names
// and acknowledges, and both close the TCP connection. A peer elsewhere
// answers that it could not, and the pair stays on TCP, so a group may mix
// transports; frames are the same on both. Waits for data or space sleep
// on an eventfd in Go's network poller, so deadlines hold, and a side
// signals only when the other has said it sleeps. The Unix socket stays
// open: its end tells a side that the other's process has gone, which then
// reads as EOF, as a TCP connection's would. Counters in the segment are
// checked before use, so a peer can corrupt only what it sends. The nonce
// travels only on the authenticated connection; the frames in shared
// memory are not encrypted, as they never leave the host and only the two
// processes map them.
//
// # Single-copy chunks
//
// Over shared memory, where each side can read the other's memory
// (process_vm_readv: same user, or CAP_SYS_PTRACE, and no seccomp policy
// against it), the chunks of 64 KiB and more of an all-reduce's ring, an
// all-gather or a broadcast travel as their address, as MPI's single-copy
// transports (cross-memory attach) do: the receiver copies each chunk
// from the sender's buffer straight into its result, and reduces it
// there, one copy instead of two (into the ring, out of it). Each side
// probes the other when the segment is set up, by reading the record of
// its mapping address the peer keeps in the segment at that very
// address, in the process the Unix socket's credentials name, and
// publishes whether it can; a side that cannot, or would not, gets bytes.
// A call that sent addresses ends only once each peer it sent them to
// says it has read every chunk, and a call that ends early (an error, a
// cancelled context) first revokes the lease that vouched for its
// buffers, so a read that overlaps it fails instead of taking bytes the
// caller may have reused. Compressed all-reduces and the direct path of
// small ones move bytes as before. The audit trail's reads_peer_memory
// says which peers a member reads.
//
// # Pushed results
//
// Every process has an arena, a sealed memfd that each peer on the host
// maps when their connection moves to shared memory (both sides send
// theirs, protocol version 7). tfdist's all-reduce op puts the results of
// AllReduceTo in spans of it. At the start of a ring all-reduce of 4 MiB or
// more, members whose links map both arenas announce where their results
// lie; when every result lies in an arena (and apart from its source),
// the ring moves no bytes through frames: each chunk of the
// reduce-scatter is written into the next member's result, where that
// member reduces it in place, and the member that completes a segment
// writes each of its chunks into every peer's result (a float32 sum in
// the same pass as its last addition), each followed by a notice frame.
// Every element is reduced along the same path as before, so every member
// holds the same bits. A member whose result lies elsewhere, or one of
// whose links does not map both arenas, announces so, and every member
// then runs the ring as usual. A call that fails keeps its result's span
// out of use for good, since a peer may still write into it. A peer that
// maps a process's arena can write anywhere in it, into the results of
// every group of the process: results are as safe as the peers on the
// host, whose identity the connection's handshake (and TLS) checked
// before the arenas were exchanged; peers on other hosts never map it.
//
// # Matching
//
// Operations are matched across members by tensor name plus a per-name
// sequence number: the n-th call with a name on one member meets the n-th
// call with that name on every other. Calls may run concurrently and start
// in different orders on different members. Every frame header carries
// magic, version, frame kind, epoch, sequence number, operation kind,
// tensor name, dtype, element count, the shape when the caller gave one
// (Shape), reduction, root, the wire type (Compress), chunk offset, step,
// chunk index and payload length. One reader goroutine per connection
// demultiplexes frames into per-operation mailboxes, buffering frames of an
// operation not started locally yet; it never waits for an operation.
// Writers send whole frames (header and payload with one writev) under a
// per-connection mutex, so frames of concurrent operations interleave whole.
//
// A receiver compares each header with its own call. If the members
// disagree (kind, dtype, length, shape, reduction, root or wire type) the
// call fails with a *MismatchError naming the operation, the tensor and
// both members with what each has, and an abort frame carries the error to
// every peer so all members fail promptly.
//
// # Algorithms
//
// All-reduce of up to 256 KiB is direct: every member sends its buffer to
// every other and each reduces all buffers in rank order. Larger buffers
// use a ring: reduce-scatter then all-gather over segments of nearly equal
// size (lengths need not divide by the group size), each cut into chunks
// of at most 1 MiB that are pipelined independently, so sending, receiving
// and reducing overlap. Either way every element is reduced along one fixed
// path and then copied, so every member ends with the same bits. Mean is a
// sum divided by the group size (truncating for integers); Float16 and
// BFloat16 are reduced in float32 and rounded to nearest even. All-gather
// and broadcast send directly to every member in chunks (groups are small);
// a broadcast's receivers also tell the root they agree on the call.
// Barrier is an all-gather of nothing. A group of one does everything
// locally.
//
// # Compression
//
// With Compress(Float16) or Compress(BFloat16), a float32 all-reduce sends
// 16-bit floats: each frame carries its chunk's elements rounded to the
// wire type (to nearest, ties to even), half the bytes; its header names
// the wire type (a field added in protocol version 3) and its offset and
// length count bytes on the wire. The ring cuts chunks in elements, so a
// compressed frame still carries at most 1 MiB. Sums are kept in float32:
// around the ring a member decodes the partial sum it receives, adds its
// own float32 values and rounds the result once to send it on, so
// precision is lost once per transfer, never accumulated in 16 bits. The
// member completing a segment divides for Mean, rounds, keeps the decoded
// rounded values and sends the same 16 bits, which the all-gather forwards
// unchanged: every member decodes the same bits. On the direct path each
// member first rounds its own buffer as its peers will receive it, so all
// reduce the same float32 inputs in rank order. A sum of n members' values
// lies within about n·2^-11 (float16) or n·2^-8 (bfloat16) of the exact
// sum, relative to the sum of magnitudes; float16 overflows to infinity
// beyond 65504. A group of one rounds nothing. Converting costs CPU, a few
// nanoseconds an element per hop, so compression pays when the network,
// not the processor, bounds the all-reduce; over loopback, where sending
// costs little more than a copy, it does not.
//
// Buffers are read in host byte order, which must be little-endian on
// every member (as on amd64 and arm64); aligned buffers are reduced in
// place, unaligned ones through an aligned copy.
//
// # Failures
//
// Every wait honours the caller's context and the group's per-operation
// timeout (one Go timer per operation); writes are bounded by the same
// deadline. A peer whose connection breaks without a goodbye fails every
// pending operation at once with a *PeerError naming it and wrapping
// ErrPeerLost; a peer that closed the group, or is closing it, fails the
// operations that still wait for it at once with a *PeerError wrapping
// ErrPeerLeft (its program has finished); a peer that hangs makes the
// operations waiting for it fail at the timeout with a *TimeoutError
// (wrapping context.DeadlineExceeded) naming it. Any failure other than the caller
// cancelling its context breaks the group: Err reports the error, every
// pending and later operation fails with it, peers receive an abort frame,
// and every connection shuts down and its goroutines exit. A cancelled
// call leaves the group working, but its peers' matching calls will not
// complete.
//
// Close starts no operation but its barrier and, when none of its own is
// pending, first sends every peer a closing frame (added in protocol
// version 2), so that a peer's operation that this member will never join
// fails at once rather than at the timeout. It then holds a barrier so that
// no member leaves while a peer still needs it, sends a goodbye frame,
// half-closes every connection, drains it to EOF (bounded) and closes it.
// A peer that is closing, or said goodbye, is only an error for operations
// that still need it: its frames of the operations it completed arrive
// before its closing frame.
//
// The transport (conn.go, frame.go, handshake.go, dial.go, upgrade.go,
// shm_*.go and arena_*.go), matching
// (mailbox.go, op.go, check.go) and algorithms (allreduce.go, ring.go,
// push.go, gather.go, reduce.go) are kept apart so that TLS can wrap connections
// after dial and accept, and new epochs or reductions can be added.
package collective
