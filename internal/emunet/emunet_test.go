package emunet

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roleEnv makes the test binary a program on a host: a server that
// echoes, or a client that measures.
const roleEnv = "EMUNET_TEST_ROLE"

func TestMain(m *testing.M) {
	flag.Parse()
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "server":
		serve()
	case "client":
		measure(os.Getenv("EMUNET_TEST_PEER"))
	case "available":
		_, err := New(1, Link{})
		fmt.Println(err)
	}
}

// serve echoes each connection's 8-byte messages, and drains a
// connection that sends more.
func serve() {
	ln, err := net.Listen("tcp", ":7000")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var b [8]byte
			for {
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return
				}
				n := binary.LittleEndian.Uint64(b[:])
				if n > 0 { // a bulk transfer of n bytes, then an ack
					if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
						return
					}
				}
				if _, err := c.Write(b[:]); err != nil {
					return
				}
			}
		}()
	}
}

// measure prints the best of 20 round trips of an 8-byte message to peer
// and the time 16 MiB take to reach it, acknowledged.
func measure(peer string) {
	var c net.Conn
	var err error
	for range 100 {
		if c, err = net.Dial("tcp", peer); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var b [8]byte
	best := time.Hour
	for range 20 {
		start := time.Now()
		_, _ = c.Write(b[:])
		if _, err := io.ReadFull(c, b[:]); err != nil {
			os.Exit(1)
		}
		best = min(best, time.Since(start))
	}
	const bulk = 16 << 20
	binary.LittleEndian.PutUint64(b[:], bulk)
	start := time.Now()
	_, _ = c.Write(b[:])
	_, _ = c.Write(make([]byte, bulk))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		os.Exit(1)
	}
	fmt.Println(best.Nanoseconds(), time.Since(start).Nanoseconds())
}

func requireAvailable(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// A program on one host reaches another's address across the link, and
// the link holds it to the link's latency and bandwidth: no round trip
// is shorter than twice the delay, and no transfer faster than the rate.
// Nothing reaches an address outside the network.
func TestLinkShapesTraffic(t *testing.T) {
	requireAvailable(t)
	l := Link{Rate: 200e6, Delay: 5 * time.Millisecond}
	nw, err := New(2, l)
	require.NoError(t, err)
	defer func() { require.NoError(t, nw.Close()) }()

	server := nw.Command(context.Background(), 1, os.Args[0])
	server.Env = append(os.Environ(), roleEnv+"=server")
	out, err := server.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, server.Start())
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	line := make([]byte, 10)
	_, err = io.ReadFull(out, line)
	require.NoError(t, err)
	require.Equal(t, "listening\n", string(line))

	client := nw.Command(context.Background(), 0, os.Args[0])
	client.Env = append(os.Environ(), roleEnv+"=client", "EMUNET_TEST_PEER="+net.JoinHostPort(nw.Addr(1).String(), "7000"))
	res, err := client.Output()
	require.NoError(t, err)
	fields := strings.Fields(string(res))
	require.Len(t, fields, 2, "%s", res)
	rtt, _ := strconv.ParseInt(fields[0], 10, 64)
	bulk, _ := strconv.ParseInt(fields[1], 10, 64)
	t.Logf("round trip %v, 16 MiB in %v (%.0f Mbit/s) over %v", time.Duration(rtt), time.Duration(bulk), 16*8*(1<<20)/float64(bulk)*1e3, l)
	assert.GreaterOrEqual(t, time.Duration(rtt), 2*l.Delay, "a round trip is at least twice the delay")
	assert.GreaterOrEqual(t, time.Duration(bulk), l.transmit(16<<20), "16 MiB take at least their time at the rate")
	assert.Greater(t, nw.Stats(0).Sent, int64(16<<20))
	assert.Greater(t, nw.Stats(1).Received, int64(16<<20))

	ping := nw.Command(context.Background(), 0, "ping", "-c", "1", "-W", "1", "10.77.0.99")
	assert.Error(t, ping.Run(), "an address outside the network answered")
	assert.Positive(t, nw.Stats(0).Dropped)
}

// namespaces returns the names of this process's emulated hosts.
func namespaces(t *testing.T) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	var mine []string
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(name, fmt.Sprintf("%s%d-", prefix, os.Getpid())) {
			mine = append(mine, name)
		}
	}
	return mine
}

// Close removes every namespace; a New that fails halfway removes those
// it made; and New removes the namespaces of a process that died without
// closing its network.
func TestNoNamespaceIsLeftBehind(t *testing.T) {
	requireAvailable(t)
	nw, err := New(3, Link{})
	require.NoError(t, err)
	assert.Len(t, namespaces(t), 3)
	require.NoError(t, nw.Close())
	assert.Empty(t, namespaces(t))

	taken := fmt.Sprintf("%s%d-%d-2", prefix, os.Getpid(), networks.Load()+1)
	require.NoError(t, ip("netns", "add", taken))
	_, err = New(3, Link{})
	require.ErrorContains(t, err, "emunet: host 2: ip netns add "+taken)
	assert.Equal(t, []string{taken}, namespaces(t), "the hosts made before the failure are gone")
	require.NoError(t, ip("netns", "del", taken))

	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale := fmt.Sprintf("%s%d-1-0", prefix, dead.Process.Pid)
	require.NoError(t, ip("netns", "add", stale))
	nw, err = New(1, Link{})
	require.NoError(t, err)
	require.NoError(t, nw.Close())
	out, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.False(t, bytes.Contains(out, []byte(stale)), "the dead process's namespace is still there")
}

func TestParseLink(t *testing.T) {
	for s, want := range map[string]Link{
		"1gbit":                {Rate: 1e9},
		"10gbit,0.2ms":         {Rate: 10e9, Delay: 200 * time.Microsecond},
		"100mbit,20ms,2ms,1%":  {Rate: 100e6, Delay: 20 * time.Millisecond, Jitter: 2 * time.Millisecond, Loss: 0.01},
		"inf,1ms":              {Delay: time.Millisecond},
		"500kbit,0s,0s,0.001%": {Rate: 500e3, Loss: 0.00001},
	} {
		got, err := ParseLink(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for s, msg := range map[string]string{
		"":                    "expected RATE[,DELAY[,JITTER[,LOSS]]]",
		"fast":                `rate "fast": expected a bandwidth such as 100mbit`,
		"-1mbit":              `rate "-1mbit"`,
		"1gbit,soon":          `delay "soon": expected a duration >= 0`,
		"1gbit,1ms,2ms":       "jitter 2ms: expected at most the delay, 1ms",
		"1gbit,1ms,0s,5":      `loss "5": expected a percentage`,
		"1gbit,1ms,0s,100%":   "loss 1: expected a probability from 0 to below 1",
		"1gbit,1ms,0s,1%,bad": "expected RATE[,DELAY[,JITTER[,LOSS]]]",
	} {
		_, err := ParseLink(s)
		assert.ErrorContains(t, err, msg, s)
	}
	_, err := New(0, Link{})
	assert.ErrorContains(t, err, "emunet: 0 hosts: expected 1 to 250")
	_, err = New(1, Link{MTU: 100})
	assert.ErrorContains(t, err, "emunet: link: MTU 100: expected 1280 to 65535")
}

// Where a host cannot be emulated, New says what is missing: root, or the
// ip command.
func TestUnavailableSaysWhatIsMissing(t *testing.T) {
	requireAvailable(t)
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
		want string
	}{
		{"not root", exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", os.Args[0]), "emunet: cannot emulate hosts here: missing root"},
		{"no ip", exec.Command(os.Args[0]), "missing the ip command (iproute2)"},
	} {
		c.cmd.Env = append(os.Environ(), roleEnv+"=available")
		if c.name == "no ip" {
			c.cmd.Env = append(c.cmd.Env, "PATH=/nonexistent")
		}
		out, err := c.cmd.Output()
		require.NoError(t, err, c.name)
		assert.Contains(t, string(out), c.want, c.name)
	}
}
