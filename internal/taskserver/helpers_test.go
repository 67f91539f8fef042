package taskserver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/partition/partitiontest"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/mtls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// timeout bounds every call of the tests.
const timeout = 20 * time.Second

// node is one task's process: its host and its server.
type node struct {
	host *partition.Host
	srv  *taskserver.Server
	addr string
	done chan error
	once sync.Once
}

// start serves a new host on addr ("127.0.0.1:0": any port), until the
// test ends.
func start(t *testing.T, addr string, opts ...taskserver.Option) *node {
	t.Helper()
	host, err := partition.NewHost(nil)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	n := &node{host: host, srv: taskserver.NewServer(host, opts...), addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { n.done <- n.srv.Serve(ln) }()
	t.Cleanup(func() { n.stop(t) })
	return n
}

// stop closes the server and its host, once.
func (n *node) stop(t *testing.T) {
	n.once.Do(func() {
		assert.NoError(t, n.srv.Close())
		assert.ErrorIs(t, <-n.done, http.ErrServerClosed)
		assert.NoError(t, n.srv.Close(), "Close again does nothing")
		assert.NoError(t, n.host.Close())
	})
}

// client is a client of addr, closed when the test ends.
func client(t *testing.T, addr string, opts ...taskserver.Option) *taskserver.Client {
	c := taskserver.NewClient(addr, append([]taskserver.Option{taskserver.WithTimeout(timeout)}, opts...)...)
	t.Cleanup(c.Close)
	return c
}

// servers is a worker and two ps tasks, each a server, and the chief's
// clients of them.
type servers struct {
	t       *testing.T
	nodes   map[string]*node
	clients map[string]*taskserver.Client
	n       int
}

// newServers starts the tasks; opts gives each task's options, and the
// chief's (task "chief").
func newServers(t *testing.T, opts func(task string) []taskserver.Option) *servers {
	if opts == nil {
		opts = func(string) []taskserver.Option { return nil }
	}
	s := &servers{t: t, nodes: map[string]*node{}, clients: map[string]*taskserver.Client{}}
	for _, task := range partitiontest.Tasks {
		s.nodes[task] = start(t, "127.0.0.1:0", append([]taskserver.Option{taskserver.WithTimeout(timeout)}, opts(task)...)...)
		s.clients[task] = client(t, s.nodes[task].addr, opts("chief")...)
	}
	return s
}

// addrs maps the tasks to their servers' addresses, the worker to "".
func (s *servers) addrs() map[string]string {
	a := map[string]string{partitiontest.Worker: ""}
	for _, task := range []string{partitiontest.PS0, partitiontest.PS1} {
		a[task] = s.nodes[task].addr
	}
	return a
}

// install imports p's fragments on their tasks and installs p on the
// worker, under a new id.
func (s *servers) install(p *partition.Plan) string {
	s.n++
	id := fmt.Sprintf("plan_%d", s.n)
	ctx := context.Background()
	for task, frag := range p.Fragments {
		require.NoError(s.t, s.clients[task].Import(ctx, id, frag))
	}
	require.NoError(s.t, s.clients[partitiontest.Worker].InstallPlan(ctx, id, p, s.addrs()))
	return id
}

func (s *servers) run(id string, feeds map[string]*tf.Tensor) []*tf.Tensor {
	out, err := s.clients[partitiontest.Worker].RunPlan(context.Background(), id, feeds)
	require.NoError(s.t, err)
	return out
}

// auditLog returns a logger and what its "audit" child records.
func auditLog() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(core), logs
}

// devices are the tasks of the tests' cluster, and the chief.
var devices = append([]string{"chief"}, partitiontest.Tasks...)

func taskOf(device string) cluster.Task {
	switch device {
	case partitiontest.Worker:
		return cluster.Task{Type: cluster.Worker}
	case partitiontest.PS0:
		return cluster.Task{Type: cluster.PS}
	case partitiontest.PS1:
		return cluster.Task{Type: cluster.PS, Index: 1}
	}
	return cluster.Task{Type: cluster.Chief}
}

// tlsConfigs writes certificates of a new CA of job for the tasks and the
// chief, and returns each one's TLS configuration.
func tlsConfigs(t *testing.T, job string) map[string]*tls.Config {
	var ts []cluster.Task
	for _, d := range devices {
		ts = append(ts, taskOf(d))
	}
	files, _, remove, err := mtls.WriteTempTasks("taskserver-test-*", job, ts, time.Hour)
	require.NoError(t, err)
	t.Cleanup(remove)
	cfgs := map[string]*tls.Config{}
	for _, d := range devices {
		cfg, err := mtls.LoadConfig(files[taskOf(d)])
		require.NoError(t, err)
		cfgs[d] = cfg
	}
	return cfgs
}

// issue writes a certificate of a for id and returns its TLS
// configuration.
func issue(t *testing.T, a *mtls.Authority, id mtls.Identity) *tls.Config {
	now := time.Now()
	fs, err := a.Write(t.TempDir(), []mtls.Identity{id}, now.Add(-time.Minute), now.Add(time.Hour))
	require.NoError(t, err)
	cfg, err := mtls.LoadConfig(fs[0])
	require.NoError(t, err)
	return cfg
}
