package launch

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/internal/emunet"
)

// linkPort is every task's port on its emulated host, unless a base port
// is set: each host's address is its own.
const linkPort = 2222

// WithLink runs each task on an emulated host of its own (package
// emunet: a network namespace, as root), whose link to the others is l,
// so that the traffic between tasks crosses it as between machines. An
// elastic job's rendezvous gets a host too, and its workers their
// address in elastic.EnvHost. The hosts are made when Run starts and
// removed when it ends.
func WithLink(l emunet.Link) Option { return func(lr *Launcher) { lr.link = &l } }

// checkLink refuses what a cluster on emulated hosts cannot do.
func (l *Launcher) checkLink() error {
	switch {
	case l.link == nil:
		return nil
	case l.metrics:
		return errors.New("link: the tasks' metrics would be served inside their hosts, out of reach")
	}
	return emunet.Available()
}

// makeHosts makes the run's emulated hosts: one per task, or for an
// elastic job one per worker it may have at once and the rendezvous's.
func (l *Launcher) makeHosts() (cleanup func(), err error) {
	n := len(l.Tasks())
	if l.elastic {
		n = l.maxWorkers + 1
	}
	if l.net, err = emunet.New(n, *l.link); err != nil {
		return nil, err
	}
	l.log.Info("tasks on emulated hosts", zap.Stringer("link", l.link), zap.Stringer("first", l.net.Addr(0)))
	return func() {
		if err := l.net.Close(); err != nil {
			l.log.Error("removing the emulated hosts", zap.Error(err))
		}
	}, nil
}

// hostAddr returns the address of the i-th task on its emulated host.
func (l *Launcher) hostAddr(i int) string {
	port := linkPort
	if l.basePort > 0 {
		port = l.basePort
	}
	return net.JoinHostPort(l.net.Addr(i).String(), strconv.Itoa(port))
}

// host returns the emulated host of the task at position index: its
// own, or an elastic job's worker shares one with those index the
// maximum of workers apart (a worker that left, say).
func (l *Launcher) host(index int) int {
	if l.elastic {
		return index % l.maxWorkers
	}
	return index
}

// taskCommand returns the process of the task at position index: the
// program, on the task's emulated host if the run has them.
func (l *Launcher) taskCommand(index int) *exec.Cmd {
	if l.net != nil {
		return l.net.Command(context.Background(), l.host(index), l.command[0], l.command[1:]...)
	}
	return exec.Command(l.command[0], l.command[1:]...)
}

// listenRendezvous listens for an elastic job's workers: on 127.0.0.1,
// or on an emulated host of its own.
func (l *Launcher) listenRendezvous() (net.Listener, error) {
	if l.net == nil {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	return l.net.Listen(l.maxWorkers, "tcp", l.hostAddr(l.maxWorkers))
}

// hostEnv tells an elastic worker at position index its address, on its
// emulated host (elastic.EnvHost).
func (l *Launcher) hostEnv(index int) []string {
	if l.net == nil || !l.elastic {
		return nil
	}
	return []string{elastic.EnvHost + "=" + l.net.Addr(l.host(index)).String()}
}
