package freeport

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// The reservations of this process: the ports it was given, and a shared
// lock file in which it holds, for each, a write lock on the byte at the
// port's offset. The kernel drops those locks when the process ends, so
// that a reservation never outlives its holder.
var reserved struct {
	sync.Mutex
	ports map[int]bool
	file  *os.File // never closed: closing it would drop every lock
	err   error    // opening the file failed: reservations are in-process only
}

// lockPath is the file in which processes reserve ports.
var lockPath = filepath.Join(os.TempDir(), "tfdist-freeport.lock")

// reserve reserves port p for this process, and reports whether it could:
// false when this process or another holds it already.
func reserve(p int) bool {
	reserved.Lock()
	defer reserved.Unlock()
	if reserved.ports[p] {
		return false
	}
	if reserved.file == nil && reserved.err == nil {
		reserved.file, reserved.err = os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o666)
		reserved.ports = map[int]bool{}
	}
	if reserved.file != nil && !lockByte(reserved.file, int64(p)) {
		return false
	}
	reserved.ports[p] = true
	return true
}

// lockByte takes a write lock on byte off of f without waiting, and
// reports whether it got it.
func lockByte(f *os.File, off int64) bool {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: off, Len: 1}
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk) == nil
}
