// Package pyenv gives tests a Python with pinned packages — TensorBoard to
// read our event files, TensorFlow and Keras to compute what our optimizers
// should, dp_accounting to check the privacy accountant — installed with pip, once, into a virtual environment under the
// tfdist cache and never into the system Python.
//
// An environment is keyed by a hash of its requirements file, so that
// changing a pin installs a new one; a file lock serialises installs across
// test processes, and a .complete marker tells a finished install from an
// interrupted one.
package pyenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Runner returns a command running Python with args, the environment's
// packages importable.
type Runner func(ctx context.Context, args ...string) *exec.Cmd

// JSON runs script with in, marshalled to JSON, on its standard input and
// unmarshals what it prints into out, failing t (with the script's standard
// error) if the script fails, prints something else or takes more than
// runTimeout.
func (r Runner) JSON(t testing.TB, script string, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := r(ctx, script)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stderr = bytes.NewReader(b), &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "%s failed:\n%s", script, stderr.String())
	require.NoError(t, json.Unmarshal(stdout, out), "%s printed: %s", script, stdout)
}

// runTimeout bounds one script's run. It only stops a hung script: a
// script that imports TensorFlow (several times, for saved_model_cli)
// takes minutes on a loaded two-core machine.
const runTimeout = 10 * time.Minute

// installTimeout bounds one install: TensorFlow's wheels are ~250 MB.
const installTimeout = 20 * time.Minute

//go:embed tensorflow-requirements.txt
var tensorflowRequirements []byte

//go:embed read_checkpoint.py
var readCheckpoint []byte

// Tensor is a tensor as Python read it: its shape and its elements,
// flattened.
type Tensor struct {
	Shape  []int64   `json:"shape"`
	Values []float64 `json:"values"`
}

// ReadCheckpoint returns every numeric tensor of the checkpoint at prefix
// by its key, as Python TensorFlow's tf.train.load_checkpoint reads it.
func ReadCheckpoint(t testing.TB, prefix string) map[string]Tensor {
	t.Helper()
	script := filepath.Join(t.TempDir(), "read_checkpoint.py")
	require.NoError(t, os.WriteFile(script, readCheckpoint, 0o644))
	var out map[string]Tensor
	TensorFlow(t).JSON(t, script, map[string]string{"prefix": prefix}, &out)
	return out
}

// TensorFlow returns a Runner for Python TensorFlow 2.18 (CPU) with Keras 3,
// pinned by tensorflow-requirements.txt beside this file: the one Python
// environment every test that compares tfdist with TensorFlow shares.
func TensorFlow(t testing.TB) Runner {
	t.Helper()
	return pinned(t, "tensorflow", tensorflowRequirements)
}

//go:embed dp-accounting-requirements.txt
var dpAccountingRequirements []byte

// DPAccounting returns a Runner for Google's dp_accounting 0.6.0, pinned by
// dp-accounting-requirements.txt beside this file, which the privacy
// accountant's tests compare with.
func DPAccounting(t testing.TB) Runner {
	t.Helper()
	return pinned(t, "dp-accounting", dpAccountingRequirements)
}

// pinned returns the Runner of the environment name whose requirements
// file holds requirements.
func pinned(t testing.TB, name string, requirements []byte) Runner {
	t.Helper()
	req := filepath.Join(t.TempDir(), name+"-requirements.txt")
	require.NoError(t, os.WriteFile(req, requirements, 0o644))
	return Python(t, name, req)
}

// unavailable skips t for want of Python, or fails it under CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("under CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// Python returns a Runner for the packages that the pip requirements file
// requirements pins, installing them the first time into the environment
// "<name>-venv-<hash>" under the tfdist cache — or, where Python's venv
// module is missing (Debian without python3-venv), into a directory put on
// PYTHONPATH. Where there is no python3 or pip cannot reach the package
// index it skips t, or fails it under CI ($CI set), where every
// comparison with Python must run; any other failure fails t.
func Python(t testing.TB, name, requirements string) Runner {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		unavailable(t, "python3 not found, so pip cannot install %s: %v", name, err)
	}
	req, err := os.ReadFile(requirements)
	require.NoError(t, err)
	sum := sha256.Sum256(req)
	root := CacheRoot(t)
	venv := filepath.Join(root, name+"-venv-"+hex.EncodeToString(sum[:6]))
	runner := func(ctx context.Context, args ...string) *exec.Cmd {
		if bin := filepath.Join(venv, "bin", "python"); fileExists(bin) {
			return exec.CommandContext(ctx, bin, args...)
		}
		cmd := exec.CommandContext(ctx, python, args...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(venv, "site"))
		return cmd
	}
	complete := filepath.Join(venv, ".complete")
	if fileExists(complete) {
		return runner
	}

	require.NoError(t, os.MkdirAll(root, 0o755))
	lock, err := os.OpenFile(filepath.Join(root, "."+name+"-venv.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX), "lock the %s install", name)
	if fileExists(complete) {
		return runner // another process installed it while we waited
	}

	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	require.NoError(t, os.RemoveAll(venv))
	pip := []string{"-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", "-r", requirements}
	if err := exec.CommandContext(ctx, python, "-m", "venv", venv).Run(); err != nil {
		t.Logf("python3 -m venv: %v; installing %s with pip --target instead", err, name)
		require.NoError(t, os.RemoveAll(venv))
		pip = append(pip, "--target", filepath.Join(venv, "site"))
	}
	t.Logf("installing %s into %s (once)", name, venv)
	if out, err := runner(ctx, pip...).CombinedOutput(); err != nil {
		probe := runner(ctx, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
			"--no-deps", "--no-cache-dir", "-q", "-d", t.TempDir(), "six==1.17.0")
		if pout, perr := probe.CombinedOutput(); perr != nil {
			unavailable(t, "pip cannot reach the package index, so %s cannot be installed: %v\n%s\n%s", name, err, out, pout)
		}
		t.Fatalf("pip install -r %s failed although the index is reachable: %v\n%s", requirements, err, out)
	}
	require.NoError(t, os.WriteFile(complete, nil, 0o644))
	return runner
}

// CacheRoot returns the tfdist cache directory, as scripts/libtensorflow.sh
// chooses it: $TFDIST_CACHE, else $XDG_CACHE_HOME/tfdist, else
// ~/.cache/tfdist.
func CacheRoot(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("TFDIST_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "tfdist")
	}
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	return filepath.Join(home, ".cache", "tfdist")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
