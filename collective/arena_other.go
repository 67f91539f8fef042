//go:build !linux

package collective

import (
	"net"
	"unsafe"
)

// arena is this process's memory that peers on the host map; there is
// none on this platform, so results are never pushed.
type arena struct{}

func (*arena) alloc(int) *sharedBuffer   { return nil }
func (*arena) offset([]byte) (int, bool) { return 0, false }
func (*arena) quarantine(int)            {}
func (*arena) release(int)               {}
func (*arena) flag(int) unsafe.Pointer   { return nil }
func setArenaBoth(net.Conn, bool)        {}
func arenaBoth(net.Conn) bool            { return false }
func processArena() (*arena, error)      { return nil, errNoShm }
