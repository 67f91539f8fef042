package archtest

import (
	"bytes"
	"encoding/json"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exported is what `go list -export -json` says of a package.
type exported struct {
	ImportPath string
	Export     string // the compiled package's export data
}

// compiled returns the export data of the module's packages and of every
// package they import, compiled by `go list -export`.
func compiled(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	files := map[string]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p exported
		require.NoError(t, dec.Decode(&p))
		files[p.ImportPath] = p.Export
	}
	return files
}

// No exported declaration of a public package names a type of an internal
// package, which no program outside tfdist could name: not in a function's
// or method's signature, an exported field, an interface's method, a
// variable's or a constant's type.
func TestNoExportedSignatureNamesAnInternalType(t *testing.T) {
	files := compiled(t)
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(files[path])
	})
	checked := 0
	for path := range files {
		rel, ok := strings.CutPrefix(path, module)
		if !ok || !public(rel) {
			continue
		}
		pkg, err := imp.Import(path)
		require.NoError(t, err, path)
		checked++
		for _, name := range pkg.Scope().Names() {
			obj := pkg.Scope().Lookup(name)
			if !obj.Exported() {
				continue
			}
			for _, leak := range internalTypes(obj) {
				t.Errorf("%s.%s names %s, a type of an internal package", rel, name, leak)
			}
		}
	}
	assert.Greater(t, checked, 10, "the public packages were checked")
}

// internalTypes returns the internal packages' types that obj's exported
// surface names: its type and, for a named type, its exported methods,
// those promoted from embedded fields included.
func internalTypes(obj types.Object) []string {
	w := &walker{seen: map[types.Type]bool{}}
	if tn, ok := obj.(*types.TypeName); ok {
		if named, ok := tn.Type().(*types.Named); ok {
			w.walk(named.Underlying())
			ms := types.NewMethodSet(types.NewPointer(named)) // promoted methods too
			for i := range ms.Len() {
				if sel := ms.At(i); sel.Obj().Exported() {
					w.walk(sel.Type())
				}
			}
			return w.leaks
		}
	}
	w.walk(obj.Type())
	return w.leaks
}

// walker collects the internal packages' named types a type refers to.
type walker struct {
	seen  map[types.Type]bool
	leaks []string
}

func (w *walker) walk(t types.Type) {
	if t == nil || w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && strings.Contains(p.Path()+"/", "/internal/") {
			w.leaks = append(w.leaks, p.Path()+"."+t.Obj().Name())
		}
		for i := range t.TypeArgs().Len() {
			w.walk(t.TypeArgs().At(i))
		}
	case *types.Pointer:
		w.walk(t.Elem())
	case *types.Slice:
		w.walk(t.Elem())
	case *types.Array:
		w.walk(t.Elem())
	case *types.Map:
		w.walk(t.Key())
		w.walk(t.Elem())
	case *types.Chan:
		w.walk(t.Elem())
	case *types.Signature:
		for _, tuple := range []*types.Tuple{t.Params(), t.Results()} {
			for i := range tuple.Len() {
				w.walk(tuple.At(i).Type())
			}
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if f := t.Field(i); f.Exported() {
				w.walk(f.Type())
			}
		}
	case *types.Interface:
		for i := range t.NumMethods() {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type())
			}
		}
	}
}
