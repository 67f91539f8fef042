// Package collective is tfdist's cross-worker collective engine, in pure
// Go: all-reduce, reduce-scatter, all-gather, broadcast and barrier between the processes
// of a group, over TCP (optionally mutual TLS) and, between processes on
// one host, over shared memory. The multi-worker strategy all-reduces its
// gradients with it; a program can also use it directly.
//
// Every member calls [New] with the same list of members and its own rank,
// then makes the same calls:
//
//	members := []collective.Member{
//		{Name: "worker:0", Addr: "10.0.0.1:2222"},
//		{Name: "worker:1", Addr: "10.0.0.2:2222"},
//	}
//	g, err := collective.New(ctx, members, rank, collective.WithTimeout(time.Minute))
//	if err != nil { ... }
//	defer g.Close(ctx)
//	// data holds float32 values in host (little-endian) byte order
//	err = g.AllReduce(ctx, "grads", collective.Sum, collective.Float32, data)
//
// Calls are matched across members by name and, for a repeated name, by
// call order, so they may run concurrently and start in different orders
// on different members. Every member ends an all-reduce with the same bits;
// a reduce-scatter leaves each member its block of them ([ScatterBlock]),
// which [Group.AllGatherBlocks] puts back together.
// [Shape] makes members check that they agree on a tensor's shape;
// [Compress] sends a float32 all-reduce as 16-bit floats, summed in
// float32 at every hop, or as int8 in blocks of a shared scale.
//
// Errors name the members involved: a call the members disagree on fails
// with a [*MismatchError]; a peer whose connection breaks fails the calls
// waiting for it with a [*PeerError] wrapping [ErrPeerLost] (or
// [ErrPeerLeft] if it closed its group), and one that hangs with a
// [*TimeoutError] at the group's timeout ([WithTimeout]). Any failure but
// the caller's own cancellation breaks the group ([Group.Err]). Close
// leaves in order, after a barrier with the other members.
//
// Peers on one host exchange frames through shared memory unless
// [WithSharedMemory](false); [WithTLS] authenticates and encrypts every
// connection (package mtls). The logger of [WithLogger], named "audit",
// records every peer that joins, leaves or is lost and every connection
// refused, with the reason.
//
// docs/collective-protocol.md in the repository describes the wire
// protocol and the algorithms.
package collective
