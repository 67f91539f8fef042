package launch_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
	"github.com/tfdist/tfdist/internal/freeport"
)

// recordMetrics is a shell command that writes the task's metrics address
// and TF_CONFIG to files named after the task.
const recordMetrics = `t="$LAUNCH_TEST_DIR/$TFDIST_TASK_TYPE:$TFDIST_TASK_INDEX"
printf %s "$TFDIST_METRICS_ADDR" > "$t.metrics"; printf %s "$TF_CONFIG" > "$t.tfconfig"`

// readMetrics returns the metrics address each task found, and the
// addresses of the cluster's servers.
func readMetrics(t *testing.T, dir string, tasks []string) (metrics map[string]string, servers []string) {
	t.Helper()
	metrics = map[string]string{}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task+".metrics"))
		require.NoError(t, err)
		metrics[task] = string(b)
	}
	b, err := os.ReadFile(filepath.Join(dir, tasks[0]+".tfconfig"))
	require.NoError(t, err)
	cfg, err := cluster.ParseTFConfig(b)
	require.NoError(t, err)
	for _, task := range cfg.Cluster.Tasks() {
		addr, err := cfg.Cluster.TaskAddress(task.Type, task.Index)
		require.NoError(t, err)
		servers = append(servers, addr)
	}
	return metrics, servers
}

// Each task serves its metrics on an address of its own, on the loopback
// interface, apart from every task's server, and the launcher logs the URL
// to scrape it on.
func TestMetricsGiveEachTaskAnAddressOfItsOwn(t *testing.T) {
	dir := t.TempDir()
	tasks := []string{"chief:0", "worker:0", "worker:1"}
	logs, err := runShell(t, dir, recordMetrics, launch.WithChief(true), launch.WithWorkers(2), launch.WithMetrics(true))
	require.NoError(t, err)
	metrics, servers := readMetrics(t, dir, tasks)
	seen := map[string]bool{}
	for _, a := range servers {
		seen[a] = true
	}
	urls := map[string][]string{}
	for _, e := range logs.FilterMessage("metrics").All() {
		task, _ := e.ContextMap()["task"].(string)
		url, _ := e.ContextMap()["url"].(string)
		urls[task] = append(urls[task], url)
	}
	for _, task := range tasks {
		addr := metrics[task]
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err, "%s: %q", task, addr)
		assert.Equal(t, "127.0.0.1", host, task)
		p, err := strconv.Atoi(port)
		require.NoError(t, err)
		assert.Positive(t, p)
		assert.False(t, seen[addr], "%s: metrics address %s is taken", task, addr)
		seen[addr] = true
		assert.Equal(t, []string{"http://" + addr + "/metrics"}, urls[task], task)
	}
}

// With a base port, the metrics ports follow the tasks' ports, in task
// order; and a metrics port in use is named as such.
func TestMetricsPortsFollowTheBasePort(t *testing.T) {
	base, err := freeport.LoopbackRange(4) // reserved: no other launcher or test takes them
	require.NoError(t, err)

	dir := t.TempDir()
	_, err = runShell(t, dir, recordMetrics, launch.WithWorkers(2), launch.WithMetrics(true), launch.WithBasePort(base))
	require.NoError(t, err)
	metrics, servers := readMetrics(t, dir, []string{"worker:0", "worker:1"})
	assert.ElementsMatch(t, []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)}, servers)
	assert.Equal(t, map[string]string{
		"worker:0": fmt.Sprintf("127.0.0.1:%d", base+2),
		"worker:1": fmt.Sprintf("127.0.0.1:%d", base+3),
	}, metrics)

	inUse, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+2))
	require.NoError(t, err)
	defer inUse.Close()
	_, err = runShell(t, t.TempDir(), "true", launch.WithWorkers(2), launch.WithMetrics(true), launch.WithBasePort(base))
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("port %d (for the metrics of worker:0) is not free", base+2))
}
