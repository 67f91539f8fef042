// Package copytest checks that every example is a program a user can copy
// into a module of their own: built outside this repository, on tfdist's
// public API, it runs.
package copytest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const modulePath = "github.com/tfdist/tfdist"

// example is one program under examples/ and what a run of its copy shows.
type example struct {
	name string   // its directory under examples/
	flag string   // a flag its -h lists ("": it takes no flags, and -h is not run)
	args []string // with want: the arguments of a short real run
	want string   // what that run prints
}

// examples lists every example program.
var examples = []example{
	{name: "classifier", flag: "-strategy"},
	{name: "elastic", flag: "-deterministic", args: []string{"-steps", "100"}, want: "held-out accuracy"},
	{name: "customloop", flag: "-decay-epochs", args: []string{"-dir", "{tmp}", "-epochs", "1", "-devices", "2"}, want: "held-out accuracy"},
	{name: "lenet", flag: "-export-dir", args: []string{"-strategy", "mirrored", "-devices", "2", "-epochs", "1"}, want: "held-out accuracy"},
	{name: "quickstart", want: "held-out accuracy"},
	{name: "recommender", flag: "-max-shard-bytes"},
	{name: "resnet", flag: "-filters"},
	{name: "transformer", flag: "-corpus"},
}

// Every example, its non-test files copied into a fresh module outside the
// repository that requires tfdist (replaced by this checkout, as a user's
// module would get it from the proxy), builds with the module cache alone
// and runs: -h lists its flags, and a short run of the quick ones trains
// and prints its held-out accuracy.
func TestExamplesBuildInAModuleOfTheirOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example as a program of its own")
	}
	root := repoRoot(t)
	pkgs := mainPackages(t, root)
	var names []string
	for _, ex := range examples {
		names = append(names, ex.name)
	}
	require.ElementsMatch(t, names, slices.Sorted(maps.Keys(pkgs)), "every main package under examples/ is in the table, and only those")

	mod := t.TempDir()
	require.False(t, strings.HasPrefix(mod, root+string(filepath.Separator)), "the copy is outside the repository")
	writeGoMod(t, root, mod)
	for _, ex := range examples {
		copyProgram(t, pkgs[ex.name], filepath.Join(mod, ex.name))
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-mod=mod", "-o", bin+string(filepath.Separator), "./...")
	build.Dir = mod
	build.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off") // the module cache alone
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build in the copy:\n%s", out)

	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			prog := filepath.Join(bin, ex.name)
			if ex.flag != "" {
				out := runProgram(t, prog, "-h")
				assert.Contains(t, out, ex.flag, "-h lists the flags")
			}
			if ex.want != "" {
				args := slices.Clone(ex.args)
				for i, a := range args {
					args[i] = strings.ReplaceAll(a, "{tmp}", t.TempDir())
				}
				assert.Contains(t, runProgram(t, prog, args...), ex.want)
			}
		})
	}
}

// runProgram runs prog with args, requires it to exit 0 and returns what it
// wrote to stdout and stderr.
func runProgram(t *testing.T, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %q:\n%s", filepath.Base(prog), args, out)
	return string(out)
}

// repoRoot returns the root of the tfdist module this test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			first, _ := bufio.NewReader(f).ReadString('\n')
			f.Close()
			require.Equal(t, "module "+modulePath, strings.TrimSpace(first), "the go.mod above %s", dir)
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's directory")
		dir = parent
	}
}

// pkg is what go list tells of a package.
type pkg struct {
	Dir, ImportPath, Name string
	EmbedFiles            []string
}

// mainPackages returns the main packages under root's examples/, by
// directory name.
func mainPackages(t *testing.T, root string) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./examples/...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	pkgs := map[string]pkg{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		require.NoError(t, dec.Decode(&p))
		if p.Name == "main" && filepath.Dir(p.ImportPath) == modulePath+"/examples" {
			pkgs[filepath.Base(p.Dir)] = p
		}
	}
	return pkgs
}

// writeGoMod writes mod's go.mod, the module example.com/copy with the
// repository's requirements and tfdist's replaced by root, and its go.sum,
// the repository's.
func writeGoMod(t *testing.T, root, mod string) {
	t.Helper()
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(gomod), "\n")
	require.True(t, ok)
	text := fmt.Sprintf("module example.com/copy\n%s\nrequire %s v0.0.0\n\nreplace %s => %s\n", rest, modulePath, modulePath, root)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte(text), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.sum"), sum, 0o644))
}

// copyProgram copies p's non-test .go files and the files it embeds into
// dir.
func copyProgram(t *testing.T, p pkg, dir string) {
	t.Helper()
	entries, err := os.ReadDir(p.Dir)
	require.NoError(t, err)
	files := slices.Clone(p.EmbedFiles)
	for _, e := range entries {
		if name := e.Name(); e.Type().IsRegular() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			files = append(files, name)
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(p.Dir, f))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
	}
}
