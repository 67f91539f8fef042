// Package shmbridge hands tfdist's TensorFlow kernels (internal/engineops)
// what package collective keeps out of its API: memory, which a group's
// peers on this host map, for the result of an all-reduce, so that the
// peers write their parts of it there directly and a kernel makes it the
// op's output tensor without a copy.
package shmbridge

import "unsafe"

// Buffer is memory for the result of an all-reduce that the group's peers
// on this host map.
type Buffer interface {
	// Bytes returns the buffer's memory, which lies outside Go's heap.
	Bytes() []byte
	// Release gives the buffer back; its memory must not be used
	// afterwards.
	Release()
	// ReleaseFlag returns the address of a 32-bit flag outside Go's heap:
	// storing 1 in it (atomically, from any thread) releases the buffer,
	// so that a C deallocator, such as a TensorFlow tensor's, can.
	ReleaseFlag() unsafe.Pointer
}

// OutputBuffer returns a buffer of n bytes for the result of an
// AllReduceTo on group, a *collective.Group; nil when the group has no
// memory its peers map (a peer elsewhere or over TCP, a buffer smaller
// than the all-reduces that write into peers' results, or the memory is
// used up): the caller then uses its own. The caller releases it when
// done with the result. Package collective sets it when it is
// initialized.
var OutputBuffer func(group any, n int) Buffer
