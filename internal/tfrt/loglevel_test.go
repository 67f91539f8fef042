package tfrt_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	_ "github.com/tfdist/tfdist/internal/tfrt" // its init sets TensorFlow's log level
)

const (
	levelEnv  = "TF_CPP_MIN_LOG_LEVEL"
	helperEnv = "TFRT_TEST_LOG_HELPER"
)

// The test binary doubles as a small TensorFlow program (helperEnv=1), so
// that tests read the stderr of a fresh process without building one.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(logHelper())
	}
	os.Exit(m.Run())
}

// logHelper makes a session and runs one step, which is when TensorFlow
// logs its start-up lines, then prints what Go's environment holds for
// TF_CPP_MIN_LOG_LEVEL.
func logHelper() int {
	s := op.NewScope()
	x := op.Const(s.SubScope("x"), [][]float32{{2}})
	y := op.MatMul(s.SubScope("y"), x, x)
	g, err := s.Finalize()
	if err == nil {
		var sess *tf.Session
		if sess, err = tf.NewSession(g, nil); err == nil {
			_, err = sess.Run(nil, []tf.Output{y}, nil)
			_ = sess.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	v, ok := os.LookupEnv(levelEnv)
	fmt.Printf("%q %v\n", v, ok)
	return 0
}

// runLogHelper starts the helper with TF_CPP_MIN_LOG_LEVEL set to level,
// or unset if level is nil, and returns its stdout and stderr.
func runLogHelper(t *testing.T, level *string) (string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, levelEnv+"=") })
	cmd.Env = append(cmd.Env, helperEnv+"=1")
	if level != nil {
		cmd.Env = append(cmd.Env, levelEnv+"="+*level)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	timer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	require.NoError(t, cmd.Wait(), "stderr:\n%s", &stderr)
	return stdout.String(), stderr.String()
}

// tslInfo matches an INFO line of TensorFlow's own logger ("2006-01-02
// 15:04:05.000000: I tensorflow/core/platform/cpu_feature_guard.cc:210] This
// TensorFlow binary is optimized...").
var tslInfo = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I `)

// mlirInfo is the INFO line TensorFlow logs through its private copy of
// Abseil's logger at a process's first session run.
const mlirInfo = "MLIR V1 optimization pass is not enabled"

// oneDNNInfo is the INFO line TensorFlow's framework library logs while it
// loads on a CPU for which it turns oneDNN on: before any Go code runs, so
// only a TF_CPP_MIN_LOG_LEVEL in the program's environment drops it.
const oneDNNInfo = "oneDNN custom operations are on"

// withoutLines returns s without its lines that contain sub.
func withoutLines(s, sub string) string {
	lines := strings.SplitAfter(s, "\n")
	return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return strings.Contains(l, sub) }), "")
}

// TensorFlow logs only warnings and errors unless TF_CPP_MIN_LOG_LEVEL
// asks for more (but for oneDNNInfo, where it logs it); this TensorFlow
// build logs cpu_feature_guard's INFO line at every process's first
// device, so the test sees the difference, on CPUs where TensorFlow read
// its level while it loaded too.
func TestTensorFlowLogIsQuietUnlessTheUserAsks(t *testing.T) {
	t.Parallel()
	t.Run("unset", func(t *testing.T) {
		t.Parallel()
		stdout, stderr := runLogHelper(t, nil)
		assert.NotContains(t, stderr, "cpu_feature_guard")
		assert.NotRegexp(t, tslInfo, withoutLines(stderr, oneDNNInfo))
		assert.NotContains(t, stderr, mlirInfo)
		assert.NotContains(t, stderr, "absl::InitializeLog")
		// Go's environment, which started processes inherit, is the user's.
		assert.Equal(t, "\"\" false\n", stdout)
	})
	for _, level := range []string{"0", ""} { // TensorFlow reads "" as 0
		t.Run(fmt.Sprintf("%q", level), func(t *testing.T) {
			t.Parallel()
			stdout, stderr := runLogHelper(t, &level)
			assert.Contains(t, stderr, "cpu_feature_guard")
			assert.Regexp(t, tslInfo, stderr)
			assert.Contains(t, stderr, mlirInfo)
			assert.Equal(t, fmt.Sprintf("%q true\n", level), stdout)
		})
	}
	t.Run("2", func(t *testing.T) {
		t.Parallel()
		level := "2"
		_, stderr := runLogHelper(t, &level)
		assert.NotContains(t, stderr, "cpu_feature_guard")
		assert.NotContains(t, stderr, mlirInfo)
	})
}

// Every program of the module that links TensorFlow (tfdist and the
// examples) imports this package, so its init quiets TensorFlow there too.
func TestEveryProgramImportsTfrt(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	const tfrt = "github.com/tfdist/tfdist/internal/tfrt"
	out, err := exec.Command(goCmd, "list", "-e", "-f",
		`{{if eq .Name "main"}}{{.ImportPath}}{{range .Deps}} {{.}}{{end}}{{"\n"}}{{end}}`,
		"github.com/tfdist/tfdist/...").Output()
	require.NoError(t, err)
	var programs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !slices.Contains(fields[1:], "github.com/wamuir/graft/tensorflow") {
			continue
		}
		programs = append(programs, fields[0])
		assert.Contains(t, fields[1:], tfrt, "%s links TensorFlow but does not import %s", fields[0], tfrt)
	}
	assert.Contains(t, programs, "github.com/tfdist/tfdist/cmd/tfdist")
}
