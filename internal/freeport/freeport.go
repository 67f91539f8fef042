// Package freeport picks TCP ports on 127.0.0.1 for the servers of a local
// cluster.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port Loopback picks.
const lowest = 10000

// Loopback returns n distinct TCP ports that were free on 127.0.0.1
// when asked. They lie below the kernel's ephemeral range, so that no
// outgoing connection takes one as its source port before its server
// binds it, as happens with the ports a listener on port 0 gets: those
// are ephemeral ones.
//
// Each port stays reserved for the life of the calling process: no later
// call, in this process or in another that uses Loopback (two launchers,
// or test binaries run side by side), returns it again, so that a server
// started on it, or restarted on it after a failure, finds it free.
// A process that binds ports by other means may still take one first;
// servers started on it fail naming the port in that case.
func Loopback(n int) ([]int, error) {
	hi := ephemeralLow()
	if hi-lowest < 4*n {
		return nil, fmt.Errorf("pick %d free loopback ports: the ephemeral range starts at %d, leaving too few below it", n, hi)
	}
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("pick %d free loopback ports between %d and %d: %d found after %d tries", n, lowest, hi, len(ports), tries)
		}
		p := lowest + rand.IntN(hi-lowest)
		if free(p) && reserve(p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// LoopbackRange returns the first of n consecutive TCP ports that were
// free on 127.0.0.1 when asked, each reserved as Loopback's are: a base
// port for servers that take consecutive ports.
func LoopbackRange(n int) (int, error) {
	hi := ephemeralLow()
	if hi-lowest < 4*n {
		return 0, fmt.Errorf("pick %d consecutive free loopback ports: the ephemeral range starts at %d, leaving too few below it", n, hi)
	}
	for range 1000 {
		base := lowest + rand.IntN(hi-lowest-n)
		if claimRange(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("pick %d consecutive free loopback ports between %d and %d: none found after 1000 tries", n, lowest, hi)
}

// claimRange reserves the n ports from base if each is free; a failure
// may leave the first ones reserved.
func claimRange(base, n int) bool {
	for p := base; p < base+n; p++ {
		if !free(p) || !reserve(p) {
			return false
		}
	}
	return true
}

// free reports whether a listener can bind port p on 127.0.0.1 now.
func free(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux), or 32768, the usual one, where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > lowest {
				return lo
			}
		}
	}
	return 32768
}
