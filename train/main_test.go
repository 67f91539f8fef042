package train_test

import (
	"fmt"
	"os"
	"testing"
)

// TestMain makes the test binary a worker of a multi-worker job when the
// process tests start it as one (see backup_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(elasticOutEnv) != "" {
		if err := elasticWorkerMain(); err != nil {
			fmt.Fprintln(os.Stderr, "elastic worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(workerEnv) != "" {
		if err := workerMain(); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
