package launch

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/emunet"
)

// linkPort is every task's port on its emulated host, unless a base port
// is set: each host's address is its own.
const linkPort = 2222

// WithLink runs each task on an emulated host of its own (package
// emunet: a network namespace, as root), whose link to the others is l,
// so that the traffic between tasks crosses it as between machines. The
// hosts are made when Run starts and removed when it ends.
func WithLink(l emunet.Link) Option { return func(lr *Launcher) { lr.link = &l } }

// checkLink refuses what a cluster on emulated hosts cannot do.
func (l *Launcher) checkLink() error {
	switch {
	case l.link == nil:
		return nil
	case l.elastic:
		return errors.New("link: an elastic job's rendezvous runs in launch, which the emulated hosts cannot reach")
	case l.metrics:
		return errors.New("link: the tasks' metrics would be served inside their hosts, out of reach")
	}
	return emunet.Available()
}

// makeHosts makes the run's emulated hosts, one per task.
func (l *Launcher) makeHosts() (cleanup func(), err error) {
	if l.net, err = emunet.New(len(l.Tasks()), *l.link); err != nil {
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

// taskCommand returns the process of the task at position index: the
// program, on the task's emulated host if the run has them.
func (l *Launcher) taskCommand(index int) *exec.Cmd {
	if l.net != nil {
		return l.net.Command(context.Background(), index, l.command[0], l.command[1:]...)
	}
	return exec.Command(l.command[0], l.command[1:]...)
}
