// Package emunet emulates hosts joined by a network on one machine, for
// tests and benchmarks of traffic that crosses a link: each host is a
// network namespace with its own address (10.77.0.1, 10.77.0.2, …) and
// nothing else to reach, and a switch in this process moves the hosts'
// packets between them through a TUN device in each namespace, shaping
// them as the Link says (bandwidth, latency, jitter, loss). Programs run
// on a host through Network.Command, unchanged: they listen on its
// address and dial the others'; shared memory between two hosts'
// processes is out of reach, as between machines, since the Unix sockets
// it is set up over belong to a namespace.
//
// The switch is the emulator, not the kernel's netem (which a kernel may
// lack): it shapes each host's link in both directions with a drop-tail
// queue, and adds the delay and jitter on delivery. Packets go only to
// the network's hosts; anything else is dropped.
//
// It needs root, the ip command and /dev/net/tun (Available says which is
// missing). Close removes every namespace; New removes what it made when
// it fails, and the namespaces of networks whose process died.
package emunet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// prefix names every namespace the package makes: tfdist-net-<pid>-<n>-<i>.
const prefix = "tfdist-net-"

// subnet is every network's: its namespaces see only each other.
var subnet = netip.MustParsePrefix("10.77.0.0/24")

// MaxHosts is the most hosts a network has.
const MaxHosts = 250

// networks counts the networks this process made, for their names.
var networks atomic.Int64

// Network is a set of emulated hosts and the switch between them.
type Network struct {
	link    Link
	hosts   []*host
	buffers sync.Pool // of *[]byte, the MTU's
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	err     error
}

// Available returns nil where this machine can emulate hosts, or an
// error naming what is missing: root, the ip command or /dev/net/tun.
func Available() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces need CAP_SYS_ADMIN)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		missing = append(missing, "the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing = append(missing, "/dev/net/tun (the kernel's TUN driver)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("emunet: cannot emulate hosts here: missing %s", strings.Join(missing, ", "))
	}
	return nil
}

// New makes n hosts joined by links of kind l and starts the switch.
func New(n int, l Link) (*Network, error) {
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("emunet: %w", err)
	}
	if n < 1 || n > MaxHosts {
		return nil, fmt.Errorf("emunet: %d hosts: expected 1 to %d", n, MaxHosts)
	}
	if err := Available(); err != nil {
		return nil, err
	}
	removeStale()
	nw := &Network{link: l, done: make(chan struct{})}
	base := fmt.Sprintf("%s%d-%d-", prefix, os.Getpid(), networks.Add(1))
	addr := subnet.Addr()
	for i := range n {
		addr = addr.Next()
		h, err := newHost(base+strconv.Itoa(i), addr, l)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("emunet: host %d: %w", i, err), nw.Close())
		}
		nw.hosts = append(nw.hosts, h)
	}
	for _, h := range nw.hosts {
		nw.wg.Add(2)
		go nw.receive(h)
		go nw.deliver(h)
	}
	return nw, nil
}

// Addr returns host i's address.
func (nw *Network) Addr(i int) netip.Addr { return nw.hosts[i].addr }

// Namespace returns the name of host i's network namespace.
func (nw *Network) Namespace(i int) string { return nw.hosts[i].ns }

// Len returns the number of hosts.
func (nw *Network) Len() int { return len(nw.hosts) }

// Link returns the network's link.
func (nw *Network) Link() Link { return nw.link }

// Command returns a command that runs name with args on host i (ip netns
// exec), killed when ctx ends: in its namespace, where it reaches the
// other hosts only.
func (nw *Network) Command(ctx context.Context, i int, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nw.hosts[i].ns, name}, args...)...)
}

// Listen listens on address (host:port; an empty host is every address)
// of host i, from this process: a server in it that the programs on the
// hosts reach.
func (nw *Network) Listen(i int, network, address string) (net.Listener, error) {
	return inNamespace(nw.hosts[i].ns, func() (net.Listener, error) { return net.Listen(network, address) })
}

// Stats returns what host i's link carried: the bytes of the packets it
// sent and received, and the packets the switch dropped on their way to
// or from it.
func (nw *Network) Stats(i int) Stats {
	h := nw.hosts[i]
	return Stats{Sent: h.sent.Load(), Received: h.received.Load(), Dropped: h.dropped.Load()}
}

// Stats counts a host's traffic.
type Stats struct {
	Sent, Received, Dropped int64
}

// Close stops the switch and removes every host's namespace. Programs
// still running on a host lose its network.
func (nw *Network) Close() error {
	nw.once.Do(func() {
		close(nw.done)
		var errs []error
		for _, h := range nw.hosts {
			_ = h.tun.Close()
		}
		nw.wg.Wait()
		for _, h := range nw.hosts {
			errs = append(errs, h.release())
		}
		nw.err = errors.Join(errs...)
	})
	return nw.err
}

// ip runs the ip command with args.
func ip(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// removeStale removes the namespaces of networks whose process has died.
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = ip("netns", "del", name)
		}
	}
}
