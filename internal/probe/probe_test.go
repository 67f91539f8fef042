package probe_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/probe"
	"github.com/tfdist/tfdist/internal/tfrt"
	pb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
)

// sockets counts this process's open sockets.
func sockets(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// Probes of a live TensorFlow server succeed and leave no socket open on
// it (here, in this process) once it has read their goodbye, where a
// connection closed without one stays open there for gRPC's 120 s
// handshake deadline; so do the waits for a cluster's tasks, which probe
// them; a probe of a closed port fails.
func TestServerLeavesNoSocketOnTheServer(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("counting sockets needs /proc (Linux)")
	}
	ports, err := freeport.Loopback(1)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	srv, err := tfrt.NewServer(&pb.ServerDef{Protocol: "grpc", JobName: "worker",
		Cluster: &pb.ClusterDef{Job: []*pb.JobDef{{Name: "worker", Tasks: map[int32]string{0: addr}}}}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { _ = srv.Close() })
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {addr}})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, probe.Server(ctx, addr)) // the server's first connection sets up what stays
	time.Sleep(200 * time.Millisecond)
	for name, call := range map[string]func() error{
		"probe.Server":         func() error { return probe.Server(ctx, addr) },
		"cluster.WaitForTasks": func() error { return cluster.WaitForTasks(ctx, spec) },
	} {
		before := sockets(t)
		for range 20 {
			require.NoError(t, call(), name)
		}
		after := sockets(t)
		for end := time.Now().Add(5 * time.Second); after > before+1 && time.Now().Before(end); after = sockets(t) {
			time.Sleep(50 * time.Millisecond)
		}
		assert.LessOrEqual(t, after, before+1, "%s: sockets open after 20 probes (%d before them)", name, before)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	assert.Error(t, probe.Server(ctx, closed), "nothing listens at %s", closed)
}
