// Package engineops holds the TensorFlow ops and kernels through which
// graphs call tfdist's collective engine (package collective).
//
// AllReduce, AllGather, Broadcast and Aggregate add ops that hand their
// input to a *collective.Group of this process, registered with
// RegisterGroup, and complete when the group does; AggregateRows and
// Aggregate combine votes with an Aggregator registered with
// RegisterAggregator. LargestIndices selects the positions of a tensor's
// largest magnitudes for top-k compression. The ops are registered with
// TensorFlow on first use, through its C API (internal/tfrt is the rest of
// tfdist's cgo); their kernels are asynchronous and run on the CPU, and
// no TensorFlow thread waits on the network or enters Go: a kernel's call
// waits in a queue that a goroutine serves.
package engineops
