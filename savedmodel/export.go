package savedmodel

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/internal/fsutil"
	"github.com/tfdist/tfdist/internal/role"
	"github.com/tfdist/tfdist/strategy"
)

// ServeTag is the tag of the MetaGraphDef Export writes: the one
// TensorFlow Serving, saved_model_cli and LoadSavedModel callers ask for.
const ServeTag = "serve"

// DefaultSignature is the key of the signature serving tools call when a
// request names none.
const DefaultSignature = "serving_default"

// Signature is one function a SavedModel serves.
type Signature struct {
	// Name is the signature's key ("serving_default").
	Name string
	// Inputs are the tensors it takes, by name: each becomes a placeholder
	// of the spec's type and shape (-1 for a dimension of any size).
	Inputs strategy.InputSpec
	// Fn builds the signature's outputs from its inputs, with the model
	// code of the training steps in inference mode. It runs once, with a
	// Replica of one replica whose Read gives a variable's exported value;
	// a signature computes, so Minimize, Assign, AssignAdd, AddTarget and
	// ReduceOutput fail the export.
	Fn strategy.ReplicaFn
}

// Option configures Export.
type Option func(*config)

type config struct {
	version int64 // 0: none; -1: the next one
	chief   *bool
	log     *zap.Logger
}

// WithVersion writes the export into <dir>/<v>/, TensorFlow Serving's
// layout of a model's versions; v must be positive.
func WithVersion(v int64) Option { return func(c *config) { c.version = v } }

// WithNextVersion writes the export into <dir>/<v>/, v being one more than
// the largest version in dir (1 in a new directory).
func WithNextVersion() Option { return func(c *config) { c.version = -1 } }

// WithChief says whether this task writes the export, overriding the
// default, which is checkpoint.NewManager's: a strategy with an IsChief
// method (multiworker.Strategy) writes only on its chief; the
// parameter-server strategy, which exists only on the chief, and a strategy
// of one process write. A task that does not write still reads the
// variables, as its peers' reads may need it, and creates nothing in dir.
func WithChief(chief bool) Option { return func(c *config) { c.chief = &chief } }

// WithLogger sets the logger (default zap.NewNop()).
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// validKey is what a signature's name, input names and output names may
// be: Python calls a signature with its inputs as keyword arguments.
var validKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Export writes a SavedModel of sigs, computed on the values src's
// variables hold now, into dir (or <dir>/<version>/ with WithVersion or
// WithNextVersion), and returns the directory written ("" on a task that
// does not write). See the package documentation for what it holds.
func Export(ctx context.Context, src strategy.ValueReader, dir string, sigs []Signature, opts ...Option) (string, error) {
	c := config{log: zap.NewNop()}
	for _, o := range opts {
		o(&c)
	}
	if err := checkArgs(src, dir, sigs, c); err != nil {
		return "", err
	}
	g, err := buildGraph(sigs)
	if err != nil {
		return "", err
	}
	values, err := g.readValues(ctx, src)
	if err != nil {
		return "", err
	}
	if !c.writes(src) {
		return "", nil
	}
	target, err := c.target(dir)
	if err != nil {
		return "", err
	}
	if err := writeAtomically(target, func(tmp string) error { return g.write(tmp, values) }); err != nil {
		return "", fmt.Errorf("savedmodel: export to %s: %w", target, err)
	}
	c.log.Info("exported SavedModel", zap.String("dir", target), zap.Strings("signatures", g.signatureNames()),
		zap.Int("variables", len(g.vars)))
	return target, nil
}

// GraphDef returns the serialized GraphDef of the inference graph Export
// writes for sigs (without the variables' values): what TensorBoard's
// graph view shows.
func GraphDef(sigs []Signature) ([]byte, error) {
	if len(sigs) == 0 {
		return nil, errors.New("savedmodel: GraphDef: no signatures; expected at least one")
	}
	if err := checkSignatures(sigs); err != nil {
		return nil, err
	}
	g, err := buildGraph(sigs)
	if err != nil {
		return nil, err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(g.def)
	if err != nil {
		return nil, fmt.Errorf("savedmodel: GraphDef: %w", err)
	}
	return b, nil
}

func checkArgs(src strategy.ValueReader, dir string, sigs []Signature, c config) error {
	switch {
	case src == nil:
		return errors.New("savedmodel: Export: nil strategy")
	case dir == "":
		return errors.New("savedmodel: Export: empty directory")
	case len(sigs) == 0:
		return errors.New("savedmodel: Export: no signatures; expected at least one (serving_default)")
	case c.version < -1:
		return fmt.Errorf("savedmodel: WithVersion(%d): expected a positive version", c.version)
	}
	return checkSignatures(sigs)
}

func checkSignatures(sigs []Signature) error {
	seen := map[string]bool{}
	for i, s := range sigs {
		switch {
		case !validKey.MatchString(s.Name):
			return fmt.Errorf("savedmodel: signature %d: name %q: expected letters, digits and _ (not starting with a digit)", i, s.Name)
		case seen[s.Name]:
			return fmt.Errorf("savedmodel: signature %q: named twice", s.Name)
		case s.Fn == nil:
			return fmt.Errorf("savedmodel: signature %q: nil Fn", s.Name)
		}
		seen[s.Name] = true
		for name, spec := range s.Inputs {
			if !validKey.MatchString(name) {
				return fmt.Errorf("savedmodel: signature %q: input name %q: expected letters, digits and _ (not starting with a digit)", s.Name, name)
			}
			if err := checkSpec(spec); err != nil {
				return fmt.Errorf("savedmodel: signature %q: input %q: %w", s.Name, name, err)
			}
		}
	}
	return nil
}

func checkSpec(spec strategy.TensorSpec) error {
	for i, d := range spec.Shape {
		if d < -1 {
			return fmt.Errorf("shape %v: dimension %d is %d, expected a size or -1 for any", spec.Shape, i, d)
		}
	}
	return nil
}

// writes reports whether this task writes the export: the rule of
// checkpoint.NewManager (internal/role).
func (c config) writes(src strategy.ValueReader) bool { return role.Writes(src, c.chief) }

// target returns the directory the export goes to: dir, or a version in
// it.
func (c config) target(dir string) (string, error) {
	v := c.version
	if v == -1 {
		last, err := LatestVersion(dir)
		if err != nil {
			return "", err
		}
		v = last + 1
	}
	if v > 0 {
		dir = filepath.Join(dir, strconv.FormatInt(v, 10))
	}
	return dir, nil
}

// LatestVersion returns the largest version of TensorFlow Serving's layout
// in dir: the largest name of a subdirectory that is a positive integer,
// 0 when there is none or dir does not exist.
func LatestVersion(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("savedmodel: versions in %s: %w", dir, err)
	}
	var last int64
	for _, e := range entries {
		if v, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && e.IsDir() && v > last {
			last = v
		}
	}
	return last, nil
}

// writeAtomically has write fill a new temporary directory beside target,
// syncs what it wrote, and renames it to target, which must not exist or
// be an empty directory.
func writeAtomically(target string, write func(tmp string) error) error {
	entries, err := os.ReadDir(target)
	switch {
	case err == nil && len(entries) > 0:
		return fmt.Errorf("the directory exists and is not empty: export into a new directory or version")
	case err == nil:
		if err := os.Remove(target); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(target)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := write(tmp); err != nil {
		return err
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, target); err != nil {
		return err
	}
	return fsutil.SyncDir(parent)
}

// syncTree syncs every file and directory under dir.
func syncTree(dir string) error {
	var syncs []func() error
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			syncs = append(syncs, func() error { return fsutil.SyncDir(p) })
		} else if err == nil {
			syncs = append(syncs, func() error { return fsutil.SyncFile(p) })
		}
		return err
	}); err != nil {
		return err
	}
	slices.Reverse(syncs) // files before the directories holding them
	for _, sync := range syncs {
		if err := sync(); err != nil {
			return err
		}
	}
	return nil
}
