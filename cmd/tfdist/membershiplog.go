package main

import (
	"fmt"
	"os"

	"github.com/tfdist/tfdist/elastic"
)

// readMembershipLog reads the membership log at path.
func readMembershipLog(path string) ([]elastic.LogEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return elastic.ReadLog(f)
}

// createMembershipLog creates the file a membership log goes to: a new
// one, never one already there.
func createMembershipLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w (a membership log goes to a new file; the one there is kept)", err)
	}
	return f, nil
}

// closeLog closes a membership log, saying so if it fails.
func closeLog(e *env, f *os.File) {
	if err := f.Close(); err != nil {
		fmt.Fprintf(e.stderr, "tfdist: close the membership log: %v\n", err)
	}
}
