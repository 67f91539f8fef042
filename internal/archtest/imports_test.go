package archtest

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/tfdist/tfdist/"

// engines are the strategies and the in-graph engine's ops: what model
// code, optimizers, data and checkpoints are written against only through
// the strategy package's contract.
var engines = []string{"onedevice", "mirrored", "multiworker", "paramserver", "internal/ingraph", "internal/engineops"}

// above are the public packages that make or run strategies, and so may
// import them.
var above = []string{"distribute", "train"}

// pkg is what `go list -json` says of a package.
type pkg struct {
	ImportPath string
	Deps       []string
}

// list returns the module's packages, each with its dependencies, as
// `go list -deps` gives them (relative to the module's path).
func list(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	pkgs := map[string][]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		require.NoError(t, dec.Decode(&p))
		var deps []string
		for _, d := range p.Deps {
			if rel, ok := strings.CutPrefix(d, module); ok {
				deps = append(deps, rel)
			}
		}
		pkgs[strings.TrimPrefix(p.ImportPath, module)] = deps
	}
	return pkgs
}

// The cgo layer over TensorFlow's C API imports nothing of tfdist's, and
// no package below the strategies (the contract, layers, optimizers, data,
// checkpoints, the collective engine) imports a strategy or the engine's
// ops: they are written against the contract alone.
func TestImportGraph(t *testing.T) {
	pkgs := list(t)
	require.Contains(t, pkgs, "internal/tfrt")
	assert.Empty(t, pkgs["internal/tfrt"], "internal/tfrt imports only TensorFlow's C API and the standard library")
	below := 0
	for p, deps := range pkgs {
		if public(p) && !slices.Contains(engines, p) && !slices.Contains(above, p) {
			below++
			for _, e := range engines {
				assert.NotContains(t, deps, e, "%s is below the strategies, so it must not import %s", p, e)
			}
		}
	}
	assert.Greater(t, below, 10, "the packages below the strategies were found")
}

// public reports whether p, relative to the module, is a package a user
// imports: not internal, not a command, not an example.
func public(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == "internal" || part == "cmd" || part == "examples" {
			return false
		}
	}
	return p != "scripts"
}
