package tfrt_test

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// Two processes' arithmetic differs in the first field that tells their
// roundings apart, named with each side's value and what would make them
// agree; alike, they match.
func TestArithmeticMatchNamesTheField(t *testing.T) {
	a := tfrt.LocalArithmetic(2)
	require.Equal(t, tfrt.Version(), a.TensorFlow)
	require.Contains(t, a.CPU, runtime.GOARCH)
	require.NoError(t, a.Match(a, "task worker:0", "task worker:1"))
	for _, c := range []struct {
		change func(*tfrt.Arithmetic)
		want   string
	}{
		{func(b *tfrt.Arithmetic) { b.TensorFlow = "2.17.0" }, "TensorFlow: task worker:0 has " + a.TensorFlow + " and task worker:1 has 2.17.0"},
		{func(b *tfrt.Arithmetic) { b.IntraOpThreads = 8 }, "intra-op threads: task worker:0 has 2 and task worker:1 has 8, so their kernels may round one step otherwise; set one count in every process: TF_NUM_INTRAOP_THREADS, or WithThreads"},
		{func(b *tfrt.Arithmetic) { b.OneDNN = !a.OneDNN }, "oneDNN's kernels: task worker:0 has"},
		{func(b *tfrt.Arithmetic) { b.CPU = "amd64 avx2 fma" + b.CPU }, "CPU: task worker:0 has " + a.CPU},
	} {
		b := a
		c.change(&b)
		assert.ErrorContains(t, a.Match(b, "task worker:0", "task worker:1"), c.want)
	}
}

// LocalArithmetic reports oneDNN as TensorFlow decided it when it loaded,
// from TF_ENABLE_ONEDNN_OPTS: off with 0, on with 1 (in a process of its
// own each, since TensorFlow reads the variable once).
func TestArithmeticReportsOneDNN(t *testing.T) {
	const child = "TFRT_TEST_ONEDNN"
	if v, ok := os.LookupEnv(child); ok {
		require.Equal(t, v == "1", tfrt.LocalArithmetic(1).OneDNN)
		return
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("TensorFlow's oneDNN kernels are in its x86-64 builds")
	}
	for _, v := range []string{"0", "1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestArithmeticReportsOneDNN$", "-test.v")
		cmd.Env = append(os.Environ(), "TF_ENABLE_ONEDNN_OPTS="+v, child+"="+v)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "TF_ENABLE_ONEDNN_OPTS=%s:\n%s", v, out)
		require.Contains(t, string(out), "--- PASS: TestArithmeticReportsOneDNN", "TF_ENABLE_ONEDNN_OPTS=%s", v)
	}
}
