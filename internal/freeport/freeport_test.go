package freeport

import (
	"net"
	"strconv"
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
