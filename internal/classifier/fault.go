package classifier

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// The fault-injection hooks of the fault-tolerance tests are environment
// variables, not flags, so that users never meet them in -h.
const (
	// EnvCrashAtStep names the step after which the training loop kills
	// its process (SIGKILL), on the job's first attempt only.
	EnvCrashAtStep = "TFDIST_TEST_CRASH_AT_STEP"
	// EnvCrashTask, with EnvCrashAtStep, names the only task (type:index,
	// e.g. worker:1) that crashes.
	EnvCrashTask = "TFDIST_TEST_CRASH_TASK"
)

// crashPlan is when a test wants the process to kill itself.
type crashPlan struct {
	step int    // 0: never
	task string // "": any task
}

// crashPlanFromEnv reads the crash plan from EnvCrashAtStep and
// EnvCrashTask.
func crashPlanFromEnv() (crashPlan, error) {
	c := crashPlan{task: os.Getenv(EnvCrashTask)}
	if v := os.Getenv(EnvCrashAtStep); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return c, fmt.Errorf("%s=%q: expected a step of at least 1", EnvCrashAtStep, v)
		}
		c.step = n
	}
	return c, nil
}

// armed reports whether this process crashes: on the job's first attempt,
// when it is the task the plan names.
func (c crashPlan) armed() bool {
	return c.step > 0 && firstAttempt() && (c.task == "" || c.task == taskName())
}

// crashIfDue kills the process, saying so on log, once step reaches the
// plan's step.
func (c crashPlan) crashIfDue(log io.Writer, step int) {
	if step >= c.step {
		fmt.Fprintf(log, "crashing on purpose after step %d\n", step)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
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
