//go:build linux

package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cross-memory reads between the two sides of a shared-memory connection
// (process_vm_readv, Linux's cross-memory attach). The segment's header page
// holds, per side s (the ring it writes):
//
//	1024 + 64*s: +0 the address of the side's mapping of the segment u64
//	  | +8 whether the side can read its peer's memory u32 (1 yes, 2 no)
//	2048 + 512*s: the side's leases, shmLeases generations u64
//
// A side probes its peer by reading the peer's own record of its mapping
// address through that very address, in the process at the other end of
// the Unix socket (as the kernel names it, not the peer). It may fail
// where the processes are not allowed to trace each other (another user,
// a seccomp policy, PID namespaces apart): the side then says no, and its
// peer sends it bytes.
//
// A lease guards memory a side exposes to its peer: the side publishes a
// new generation in a slot before it sends the address, and a later one
// when it no longer vouches for the memory. The peer checks the slot after
// its read: an unchanged generation means the read completed while the
// memory was still exposed.
const (
	shmProbeOffset = 1024
	shmLeaseOffset = 2048
	shmLeases      = 64
)

// Answers a side publishes at +8 of its probe record.
const (
	probeUnknown uint32 = iota
	probeReadable
	probeUnreadable
)

func (c *shmConn) u64At(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&c.mem[off]))
}

func (c *shmConn) u32At(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&c.mem[off]))
}

// publishMapping records in the segment mapped at mem where side mapped
// it, for the peer's probe.
func publishMapping(mem []byte, side int) {
	(*atomic.Uint64)(unsafe.Pointer(&mem[shmProbeOffset+64*side])).Store(uint64(uintptr(unsafe.Pointer(&mem[0]))))
}

// probePeer tries to read the peer's memory, unless told not to, once the
// peer has published its mapping, and publishes the answer.
func (c *shmConn) probePeer(try bool) {
	if !c.acquire() {
		return
	}
	defer c.release()
	peer := shmProbeOffset + 64*(1-c.side)
	addr := c.u64At(peer).Load()
	ok := try && addr != 0 && c.peerPid() > 0
	if ok {
		var seen [8]byte
		err := c.readRemote(seen[:], addr+uint64(peer))
		ok = err == nil && binary.NativeEndian.Uint64(seen[:]) == addr
	}
	answer := probeUnreadable
	if ok {
		answer = probeReadable
	}
	c.readable = ok
	c.u32At(shmProbeOffset + 64*c.side + 8).Store(answer)
}

// peerPid returns the peer's process ID as the Unix socket's credentials
// give it, or 0 if they are not to be had in this PID namespace.
func (c *shmConn) peerPid() int {
	if c.pid != 0 {
		return c.pid
	}
	raw, err := c.ctl.SyscallConn()
	if err != nil {
		return 0
	}
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			c.pid = int(cred.Pid)
		}
	})
	return c.pid
}

// peerReads reports whether the peer has said it can read this process's
// memory.
func (c *shmConn) peerReads() bool {
	if !c.acquire() {
		return false
	}
	defer c.release()
	return c.u32At(shmProbeOffset+64*(1-c.side)+8).Load() == probeReadable
}

// canRead reports whether this side's probe of the peer succeeded.
func (c *shmConn) canRead() bool { return c.readable }

// errShortRead fails a cross-memory read the kernel cut short.
var errShortRead = errors.New("the peer's memory ended before the chunk did")

// readRemote copies len(dst) bytes from addr in the peer's memory.
func (c *shmConn) readRemote(dst []byte, addr uint64) error {
	for len(dst) > 0 {
		local := []unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}}
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
		n, err := unix.ProcessVMReadv(c.pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("reading the peer's memory: %w", err)
		}
		if n == 0 {
			return errShortRead
		}
		dst, addr = dst[n:], addr+uint64(n)
	}
	return nil
}

// lease takes a free slot and publishes a new generation in it.
func (c *shmConn) lease() (slot int, gen uint64, ok bool) {
	if !c.acquire() {
		return 0, 0, false
	}
	defer c.release()
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	for i := range shmLeases {
		if c.leased&(1<<i) == 0 {
			c.leased |= 1 << i
			c.gens[i]++
			c.u64At(shmLeaseOffset + 512*c.side + 8*i).Store(c.gens[i])
			return i, c.gens[i], true
		}
	}
	return 0, 0, false
}

// revoke publishes a new generation in slot, ending its lease, and frees it.
func (c *shmConn) revoke(slot int) {
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	c.gens[slot]++
	if c.acquire() {
		c.u64At(shmLeaseOffset + 512*c.side + 8*slot).Store(c.gens[slot])
		c.release()
	}
	c.leased &^= 1 << slot
}

// leaseHeld reports whether the peer's slot still holds gen. The locked
// add orders every load before it, the cross-memory read's included.
func (c *shmConn) leaseHeld(slot int, gen uint64) bool {
	if slot < 0 || slot >= shmLeases || !c.acquire() {
		return false
	}
	defer c.release()
	return c.u64At(shmLeaseOffset+512*(1-c.side)+8*slot).Add(0) == gen
}

// probeShm has this side of a new shared-memory connection probe its
// peer (if try), once the peer has published its mapping, and publish
// the answer.
func probeShm(nc net.Conn, try bool) {
	if c, ok := nc.(*shmConn); ok {
		c.probePeer(try)
	}
}
