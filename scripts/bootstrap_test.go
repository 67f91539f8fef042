// Package scripts holds the tests of the project's shell scripts.
package scripts

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bootstrap runs libtensorflow.sh with env on top of a clean environment
// and returns its stdout, stderr and error.
func bootstrap(t *testing.T, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"libtensorflow.sh"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// installed returns the library directory the bootstrap resolves on this
// machine (make test installs it before running the tests).
func installed(t *testing.T) string {
	t.Helper()
	out, stderr, err := bootstrap(t, map[string]string{"TFDIST_CACHE": os.Getenv("TFDIST_CACHE")}, "--dir")
	require.NoError(t, err, stderr)
	return strings.TrimSpace(out)
}

func TestNamedDirectoryIsUsedAndExported(t *testing.T) {
	dir := installed(t)
	out, _, err := bootstrap(t, map[string]string{"LIBTENSORFLOW_DIR": dir})
	require.NoError(t, err)
	assert.Contains(t, out, `export CGO_CFLAGS="-I`+dir+`/include"`)
	assert.Contains(t, out, `-Wl,-rpath,`+dir+`/lib`)
	assert.Contains(t, out, `export LD_LIBRARY_PATH="`+dir+`/lib`)
	assert.FileExists(t, filepath.Join(dir, "include/tensorflow/c/c_api.h"))
	assert.FileExists(t, filepath.Join(dir, "include/tsl/platform/ctstring.h"))
	assert.FileExists(t, filepath.Join(dir, "include/xla/tsl/c/tsl_status.h"))
}

// A run after the install reuses it: nothing is downloaded, and the
// installed library is not rewritten.
func TestSecondRunReusesTheInstall(t *testing.T) {
	lib := filepath.Join(installed(t), "lib", "libtensorflow_cc.so.2")
	before, err := os.Stat(lib)
	require.NoError(t, err)
	_, stderr, err := bootstrap(t, map[string]string{"TFDIST_CACHE": os.Getenv("TFDIST_CACHE")})
	require.NoError(t, err, stderr)
	assert.NotContains(t, stderr, "downloading")
	after, err := os.Stat(lib)
	require.NoError(t, err)
	assert.Equal(t, before.ModTime(), after.ModTime(), "the library is not rewritten")
}

func TestMissingDirectory(t *testing.T) {
	_, stderr, err := bootstrap(t, map[string]string{"LIBTENSORFLOW_DIR": "/nonexistent/tf"})
	require.Error(t, err)
	assert.Contains(t, stderr, "LIBTENSORFLOW_DIR=/nonexistent/tf is not usable")
	assert.Contains(t, stderr, "no lib/libtensorflow.so")
}

// A library that is not TensorFlow 2.18 is refused, with its version named.
func TestWrongVersionIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "include/tensorflow/c"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "include/tensorflow/c/c_api.h"), []byte("const char* TF_Version(void);\n"), 0o644))
	src := filepath.Join(dir, "v.c")
	require.NoError(t, os.WriteFile(src, []byte(`const char* TF_Version(void) { return "2.17.0"; }`), 0o644))
	out, err := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(dir, "lib/libtensorflow.so"), src).CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.Symlink("libtensorflow.so", filepath.Join(dir, "lib/libtensorflow_framework.so")))
	_, stderr, err := bootstrap(t, map[string]string{"LIBTENSORFLOW_DIR": dir})
	require.Error(t, err)
	assert.Contains(t, stderr, "TensorFlow 2.17.0, expected 2.18.x")
}

// An install without libtensorflow_framework, which holds the kernel API
// that tfdist's collective ops use, is refused and the file named.
func TestMissingFrameworkLibraryIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "include/tensorflow/c"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "include/tensorflow/c/c_api.h"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lib/libtensorflow.so"), nil, 0o644))
	_, stderr, err := bootstrap(t, map[string]string{"LIBTENSORFLOW_DIR": dir})
	require.Error(t, err)
	assert.Contains(t, stderr, "no lib/libtensorflow_framework.so")
}

// fakePip writes a pip stand-in: it answers --version and runs script for
// everything else.
func fakePip(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pip")
	body := "#!/usr/bin/env bash\nif [ \"$1\" = --version ]; then echo 'pip 23 (fake)'; exit 0; fi\n" + script + "\n"
	require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	return p
}

// With no usable source, the script tries the download once, fails and
// says what it tried and what the user can do; nothing is left
// half-installed.
func TestNoSourceFailsFastAndClearly(t *testing.T) {
	cache := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	pip := fakePip(t, `echo x >> `+count+`
echo "ERROR: Could not find a version that satisfies the requirement (network unreachable)" >&2; exit 1`)
	_, stderr, err := bootstrap(t, map[string]string{"TFDIST_CACHE": cache, "PIP": pip})
	require.Error(t, err)
	n, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(n), "x"), "one download attempt, no retry of an unreachable index")
	for _, want := range []string{"no usable TensorFlow 2.18.0 C library", "official archive: skipped",
		"pip download tensorflow-cpu==2.18.0 failed", "what you can do", "LIBTENSORFLOW_DIR"} {
		assert.Contains(t, stderr, want)
	}
	assertNothingInstalled(t, cache)

	_, stderr, err = bootstrap(t, map[string]string{"TFDIST_CACHE": cache, "TFDIST_OFFLINE": "1"})
	require.Error(t, err)
	assert.Contains(t, stderr, "downloads: not attempted")
}

// A download whose checksum does not match is deleted and fetched once more,
// then the script fails, leaving nothing behind.
func TestChecksumMismatchRetriesOnceThenFails(t *testing.T) {
	cache := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	pip := fakePip(t, `dest=""; while [ $# -gt 0 ]; do if [ "$1" = -d ]; then dest=$2; fi; shift; done
echo x >> `+count+`
mkdir -p "$dest"; echo corrupted > "$dest/tensorflow_cpu-2.18.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"`)
	_, stderr, err := bootstrap(t, map[string]string{"TFDIST_CACHE": cache, "PIP": pip})
	require.Error(t, err)
	assert.Contains(t, stderr, "sha256 mismatch (attempt 1)")
	assert.Contains(t, stderr, "sha256 mismatch (attempt 2)")
	n, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(n), "x"), "one download and one retry")
	assertNothingInstalled(t, cache)
}

func assertNothingInstalled(t *testing.T, cache string) {
	t.Helper()
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	for _, e := range entries {
		assert.Equal(t, ".lock", e.Name(), "left behind: %s", e.Name())
	}
}
