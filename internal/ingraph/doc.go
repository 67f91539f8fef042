// Package ingraph is the in-graph replication engine behind the one-device
// strategy, Mirrored and MultiWorkerMirrored: one TensorFlow graph holds
// every local replica's copy of a step, pinned to its device, and one
// session run executes a global step on all of them. It implements
// package strategy's contract (Strategy, Scope, Replica, ApplyContext);
// onedevice, mirrored and multiworker configure it (Config: devices,
// session, CrossDeviceOps and their hooks) and embed it.
//
// A step is traced once per local replica (Build). Cross-replica calls
// (AllReduce, AllGather, Minimize, ApplyGradients, an OnWrite Assign) are
// merge points: every replica reaches them in the same order, and the
// merger builds their cross-device reductions once all have. Minimize with
// WithAccumulation(k) makes every run a micro-step that accumulates the
// gradients, and the k-th all-reduces and applies them.
package ingraph
