package emunet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// host is an emulated host: its namespace, the TUN device the switch
// reads its packets from and writes its packets to, and its link's state.
type host struct {
	ns   string
	addr netip.Addr
	tun  *os.File

	upFree time.Time // when the uplink has sent what is queued (receive's only)

	mu       sync.Mutex
	downFree time.Time // when the downlink has sent what is queued
	last     time.Time // the latest delivery time queued
	queue    []packet  // to deliver, in time order
	wake     chan struct{}

	sent, received, dropped atomic.Int64
}

// packet is a packet on its way to a host, due at time at.
type packet struct {
	data []byte
	at   time.Time
}

// newHost makes namespace ns with a TUN device at addr, its link's MTU.
func newHost(ns string, addr netip.Addr, l Link) (*host, error) {
	if err := ip("netns", "add", ns); err != nil {
		return nil, err
	}
	h := &host{ns: ns, addr: addr, wake: make(chan struct{}, 1)}
	tun, err := openTUN(ns)
	if err == nil {
		h.tun = tun
		err = configure(ns, addr, l.mtu())
	}
	if err != nil {
		return nil, errors.Join(err, h.release())
	}
	return h, nil
}

// configure brings ns's loopback and TUN device up, the device with addr
// in the network's subnet.
func configure(ns string, addr netip.Addr, mtu int) error {
	for _, args := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", "tun0", "mtu", strconv.Itoa(mtu), "up"},
		{"-n", ns, "addr", "add", netip.PrefixFrom(addr, subnet.Bits()).String(), "dev", "tun0"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// release closes the TUN device (which removes it) and deletes the
// namespace.
func (h *host) release() error {
	var err error
	if h.tun != nil {
		_ = h.tun.Close()
	}
	if e := ip("netns", "del", h.ns); e != nil {
		err = e
	}
	return err
}

// inNamespace returns what fn returns when called on a thread in
// namespace ns, which is then discarded (its goroutine ends locked to
// it): what fn makes, a device or a socket, stays in ns.
func inNamespace[T any](ns string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		var r result
		nsf, err := os.Open("/run/netns/" + ns)
		if err == nil {
			err = unix.Setns(int(nsf.Fd()), unix.CLONE_NEWNET)
			_ = nsf.Close()
		}
		if err != nil {
			r.err = fmt.Errorf("enter namespace %s: %w", ns, err)
		} else {
			r.v, r.err = fn()
		}
		done <- r
	}()
	r := <-done
	return r.v, r.err
}

// openTUN opens a new TUN device, tun0, in namespace ns.
func openTUN(ns string) (*os.File, error) {
	return inNamespace(ns, func() (*os.File, error) { return tunIn(ns) })
}

// tunIn opens tun0 in the namespace of this thread, ns.
func tunIn(ns string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], "tun0")
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("create tun0 in %s: %w", ns, errno)
	}
	return os.NewFile(uintptr(fd), "tun0@"+ns), nil
}
