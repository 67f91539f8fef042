package classifier

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/tfdist/tfdist/internal/faults"
)

// Faults are the faults a run injects on purpose, for tfdist's own tests
// of fault tolerance and robust aggregation. No flag or environment
// variable of a tfdist program sets them: the tests set them, in-process,
// or through the test-only program internal/cmd/digits/testdata/faulty.
type Faults struct {
	// CrashAtStep is the step after which the training loop kills its
	// process (SIGKILL), on the job's first attempt only; 0: never.
	CrashAtStep int
	// CrashTask, with CrashAtStep, names the only task (type:index, e.g.
	// worker:1) that crashes; "": any.
	CrashTask string
	// VoteAttack, with -aggregation, makes a worker (a replica under
	// mirrored) faulty: the rule sees its vote corrupted
	// (faults.VoteAttack.Rule), or, of kind NaN, its gradients are NaN.
	VoteAttack *faults.VoteAttack
}

func (f Faults) check() error {
	if f.CrashAtStep < 0 {
		return fmt.Errorf("Faults.CrashAtStep %d: expected a step of at least 1, or 0 for none", f.CrashAtStep)
	}
	return nil
}

// armed reports whether this process crashes: on the job's first attempt,
// when it is the task the plan names.
func (f Faults) armed() bool {
	return f.CrashAtStep > 0 && firstAttempt() && (f.CrashTask == "" || f.CrashTask == taskName())
}

// crashIfDue kills the process, saying so on log, once step reaches
// CrashAtStep.
func (f Faults) crashIfDue(log io.Writer, step int) {
	if step >= f.CrashAtStep {
		fmt.Fprintf(log, "crashing on purpose after step %d\n", step)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// poisoned reports whether the replica's gradients are NaN: those of the
// faulty worker of a NaN VoteAttack (its replica, under mirrored).
func (o Options) poisoned(replica int) bool {
	a := o.Faults.VoteAttack
	if a == nil || a.Kind != faults.NaN || o.Aggregation == "" {
		return false
	}
	if o.Strategy == "mirrored" {
		return replica == a.Worker
	}
	return replica/o.Devices == a.Worker
}

// firstAttempt reports whether this is the first run of the job, not a run
// tfdist launch restarted after a failure.
func firstAttempt() bool {
	r := os.Getenv("TFDIST_RESTART")
	return r == "" || r == "0"
}

// taskName returns this process's task as type:index, from the variables
// tfdist launch sets, or "" outside a launched cluster.
func taskName() string {
	t, i := os.Getenv("TFDIST_TASK_TYPE"), os.Getenv("TFDIST_TASK_INDEX")
	if t == "" {
		return ""
	}
	return t + ":" + i
}
