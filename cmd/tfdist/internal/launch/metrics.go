package launch

import (
	"fmt"
	"net"
	"strconv"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/monitoring"
)

// numPorts returns how many ports an attempt takes: one per task, and one
// more per task for its metrics.
func (l *Launcher) numPorts() int { return len(l.Tasks()) * (1 + boolInt(l.metrics)) }

// portUser names what the i-th port of an attempt is for.
func (l *Launcher) portUser(i int) string {
	tasks := l.Tasks()
	if i < len(tasks) {
		return tasks[i].String()
	}
	return "the metrics of " + tasks[i-len(tasks)].String()
}

// assignMetrics gives the tasks, in order, the metrics ports of an attempt
// and logs the address to scrape each on.
func (l *Launcher) assignMetrics(tasks []cluster.Task, ports []int) {
	if !l.metrics {
		return
	}
	l.metricsAddrs = make(map[cluster.Task]string, len(tasks))
	for i, t := range tasks {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i]))
		l.metricsAddrs[t] = addr
		l.log.Info("metrics", zap.Stringer("task", t), zap.String("url", "http://"+addr+"/metrics"))
	}
}

// assignElasticMetrics gives a worker of an elastic job, at its first
// start, a free loopback port for its metrics, which the processes that
// replace it keep.
func (l *Launcher) assignElasticMetrics(t cluster.Task) error {
	if !l.elastic || !l.metrics {
		return nil
	}
	if _, ok := l.metricsAddrs[t]; ok {
		return nil
	}
	ports, err := freeport.Loopback(1)
	if err != nil {
		return fmt.Errorf("a port for the metrics of %s: %w", t, err)
	}
	if l.metricsAddrs == nil {
		l.metricsAddrs = map[cluster.Task]string{}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	l.metricsAddrs[t] = addr
	l.log.Info("metrics", zap.Stringer("task", t), zap.String("url", "http://"+addr+"/metrics"))
	return nil
}

// metricsEnv returns the environment that gives t its metrics address, if
// any.
func (l *Launcher) metricsEnv(t cluster.Task) []string {
	addr, ok := l.metricsAddrs[t]
	if !ok {
		return nil
	}
	return []string{monitoring.Env + "=" + addr}
}
