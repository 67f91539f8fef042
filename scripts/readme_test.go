package scripts

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's quickstart, pasted into a new module, builds and runs.
func TestReadmeQuickstartBuildsAndRuns(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	text := string(readme)
	i := strings.Index(text, "## Five-minute quickstart")
	require.GreaterOrEqual(t, i, 0, "the README has a quickstart")
	code := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(text[i:])
	require.NotNil(t, code, "the quickstart has a Go program")

	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(code[1]), 0o644))
	mod := "module example.com/quickstart\n\ngo 1.23\n\nrequire github.com/tfdist/tfdist v0.0.0\n\nreplace github.com/tfdist/tfdist => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644))
	goCmd := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %v:\n%s", args, out)
		return string(out)
	}
	goCmd("mod", "tidy")
	goCmd("build", "-o", "quickstart", ".")
	cmd := exec.Command(filepath.Join(dir, "quickstart"))
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2")
	out, err := cmd.Output()
	require.NoError(t, err, string(out))
	text = string(out)
	assert.Equal(t, 10, strings.Count(text, "Epoch "), "a header per epoch:\n%s", text)
	losses := regexp.MustCompile(`- loss: ([0-9.]+)`).FindAllStringSubmatch(text, -1)
	require.Len(t, losses, 10, "a progress line per epoch:\n%s", text)
	var first, last, acc float64
	_, err = fmt.Sscan(losses[0][1], &first)
	require.NoError(t, err)
	_, err = fmt.Sscan(losses[9][1], &last)
	require.NoError(t, err)
	assert.Less(t, last, first/2, "the loss falls")
	m := regexp.MustCompile(`held-out accuracy ([0-9.]+)%`).FindStringSubmatch(text)
	require.NotNil(t, m, text)
	_, err = fmt.Sscan(m[1], &acc)
	require.NoError(t, err)
	assert.Greater(t, acc, 90.0)
}
