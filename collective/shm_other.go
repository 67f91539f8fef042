//go:build !linux

package collective

import (
	"errors"
	"net"
	"time"
)

// shmSupported reports whether this platform has the shared-memory
// transport: Linux only, so peers here stay on TCP.
const shmSupported = false

var errNoShm = errors.New("shared memory: not supported on this platform")

func listenShm() (*net.UnixListener, error) { return nil, errNoShm }

func dialShm(string, []byte, time.Time, net.Conn) (net.Conn, error) { return nil, errNoShm }

func receiveShm(*net.UnixConn, time.Time) ([]byte, shmDelivery, error) {
	return nil, shmDelivery{}, errNoShm
}

// shmDelivery is a segment a dialer sent; none arrive on this platform.
type shmDelivery struct{}

func (shmDelivery) open(net.Conn) (net.Conn, error) { return nil, errNoShm }

func (shmDelivery) discard() {}

func probeShm(net.Conn, bool) {}
