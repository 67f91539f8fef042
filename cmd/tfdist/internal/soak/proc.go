package soak

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// readProc samples process pid from /proc: its OS threads, resident memory
// and open file descriptors.
func readProc(pid int) (Sample, error) {
	var s Sample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, val, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(val)
		if len(f) == 0 {
			continue
		}
		switch string(key) {
		case "State":
			if f[0][0] == 'Z' {
				return s, fmt.Errorf("process %d has exited", pid)
			}
		case "Threads":
			s.Threads, _ = strconv.Atoi(string(f[0]))
		case "VmRSS": // in kB
			kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
			s.RSS = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.FDs = len(fds)
	return s, nil
}
