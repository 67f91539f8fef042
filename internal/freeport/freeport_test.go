package freeport

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ports are distinct, free to bind, and outside the ephemeral range
// that outgoing connections take their source ports from.
func TestLoopbackPortsAreFreeAndNotEphemeral(t *testing.T) {
	ports, err := Loopback(8)
	require.NoError(t, err)
	require.Len(t, ports, 8)
	seen := map[int]bool{}
	for _, p := range ports {
		assert.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, lowest)
		assert.Less(t, p, ephemeralLow())
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d", p)
		require.NoError(t, l.Close())
	}
	// An outgoing connection's source port is ephemeral.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	assert.GreaterOrEqual(t, c.LocalAddr().(*net.TCPAddr).Port, ephemeralLow())
}

// A port once given is not given again for the life of the process: not
// by a later call in this process, nor to another process that asks,
// such as a second test binary picking ports for its own cluster.
func TestPortsStayReservedAcrossProcesses(t *testing.T) {
	if ports := os.Getenv("FREEPORT_CHILD_TRIES"); ports != "" {
		for _, f := range strings.Fields(ports) {
			p, err := strconv.Atoi(f)
			require.NoError(t, err)
			assert.False(t, reserve(p), "port %d, reserved by the parent, was given to this process", p)
		}
		return
	}
	first, err := Loopback(16)
	require.NoError(t, err)
	for _, p := range first {
		assert.False(t, reserve(p), "port %d given twice in one process", p)
	}
	var args []string
	for _, p := range first {
		args = append(args, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPortsStayReservedAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FREEPORT_CHILD_TRIES="+strings.Join(args, " "))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the other process:\n%s", out)
	require.Contains(t, string(out), "PASS")
}

// A range is consecutive ports, each free to bind and below the
// ephemeral range, none of which Loopback or another range gives again.
func TestLoopbackRangeIsConsecutiveAndReserved(t *testing.T) {
	base, err := LoopbackRange(4)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, base, lowest)
	assert.Less(t, base+3, ephemeralLow())
	for p := base; p < base+4; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d", p)
		require.NoError(t, l.Close())
		assert.False(t, reserve(p), "port %d is reserved", p)
	}
	other, err := LoopbackRange(4)
	require.NoError(t, err)
	assert.True(t, other+3 < base || other > base+3, "ranges %d and %d overlap", base, other)
}
