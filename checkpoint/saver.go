package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// Source is what a Saver needs from a strategy: its State, the extension
// point through which the Saver lists the strategy's variables, builds save
// and restore ops over them and runs those. Every tfdist strategy is a
// Source: the default strategy, Mirrored, MultiWorkerMirrored and the
// parameter-server strategy.
type Source interface {
	State() strategy.State
}

// MetadataPrefix prefixes the checkpoint keys of metadata. Variable names
// cannot start with '_', so metadata never collides with a variable.
const MetadataPrefix = "_tfdist/metadata/"

// CopiesPrefix prefixes the checkpoint key of the replicas' copies of a
// variable (strategy.Saveable.Copies): CopiesPrefix+name holds one row per
// replica, beside the variable's value under its own name.
const CopiesPrefix = "_tfdist/replicas/"

// GlobalStepKey is the metadata key under which Manager.Save records the
// training step.
const GlobalStepKey = "global_step"

// Metadata are named scalars saved with a checkpoint, such as the global
// step and the position of the input pipeline. Values are int64, float64 or
// string (int, int32 and uint32 are saved as int64, float32 as float64);
// Restore returns them with those types. Each is stored in the checkpoint as
// a scalar tensor named MetadataPrefix+key, written by the same SaveV2 as
// the variables, so metadata is exactly as durable as the checkpoint, and
// tf.train.load_checkpoint(prefix).get_tensor("_tfdist/metadata/global_step")
// reads it in Python.
type Metadata map[string]any

// Int64 returns the int64 value of key.
func (m Metadata) Int64(key string) (int64, bool) {
	v, ok := m[key].(int64)
	return v, ok
}

// Float64 returns the float64 value of key.
func (m Metadata) Float64(key string) (float64, bool) {
	v, ok := m[key].(float64)
	return v, ok
}

// Text returns the string value of key.
func (m Metadata) Text(key string) (string, bool) {
	v, ok := m[key].(string)
	return v, ok
}

// Saver writes the variables of a strategy to a checkpoint in TensorFlow's
// V2 format and restores them. It builds its save and restore ops once and
// rebuilds them when the strategy's variables change (optimizer slots
// appear when a training step is built). A Saver is safe for concurrent use;
// a save or restore runs as one Session.Run, never concurrently with a step.
type Saver struct {
	st  strategy.State
	cfg config

	mu       sync.Mutex
	saves    map[string]*saveGraph
	restores map[string]*restoreGraph
}

type saveGraph struct {
	prefix tf.Output
	meta   []tf.Output // metadata placeholders, in key order
	target *tf.Operation
	shards int
}

type restoreGraph struct {
	prefix tf.Output
	meta   []tf.Output // restored metadata, in key order
	target *tf.Operation
	done   []func()
}

// NewSaver returns a Saver of src's variables. Options: WithLogger,
// WithSharding, WithAllowPartial.
func NewSaver(src Source, opts ...Option) (*Saver, error) {
	if src == nil {
		return nil, errors.New("checkpoint: NewSaver: nil strategy")
	}
	st := src.State()
	if st == nil {
		return nil, errors.New("checkpoint: NewSaver: the strategy has no state")
	}
	return &Saver{st: st, cfg: newConfig(opts), saves: map[string]*saveGraph{}, restores: map[string]*restoreGraph{}}, nil
}

// Save writes every variable of the strategy, and md, to the checkpoint
// prefix: <prefix>.index and <prefix>.data-<shard>-of-<shards>, created with
// their directory if need be and replaced if they exist. Each variable is
// saved as one tensor however the strategy holds it: an in-graph strategy's
// OnWrite variable from its primary copy and an OnRead variable as the
// aggregate of its copies (and its copies too, see CopiesPrefix), a
// parameter-server strategy's sharded variable
// as the slices its ps tasks hold, each written by its ps task. Save writes
// the files in place: use a Manager for checkpoints that a crash mid-write
// must not damage.
func (s *Saver) Save(ctx context.Context, prefix string, md Metadata) error {
	if prefix == "" {
		return errors.New("checkpoint: Save: empty prefix")
	}
	keys, vals, err := md.Encode()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", prefix, err)
	}
	start := time.Now()
	items := s.st.Saveables()
	s.mu.Lock()
	defer s.mu.Unlock()
	sig := signature(items, keys, dtypesOf(vals))
	g, ok := s.saves[sig]
	if !ok {
		if g, err = s.buildSave(items, keys, dtypesOf(vals)); err != nil {
			return err
		}
		s.saves[sig] = g
	}
	pt, err := tf.NewTensor(prefix)
	if err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", prefix, err)
	}
	feeds := map[tf.Output]*tf.Tensor{g.prefix: pt}
	for i, p := range g.meta {
		feeds[p] = vals[i]
	}
	if _, err := s.st.Run(ctx, feeds, nil, []*tf.Operation{g.target}, nil); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", prefix, err)
	}
	s.cfg.log.Debug("checkpoint written", zap.String("prefix", prefix), zap.Int("variables", len(items)),
		zap.Int("metadata", len(keys)), zap.Int("shards", g.shards), zap.Duration("took", time.Since(start)))
	return nil
}

// Restore reads the checkpoint at prefix into every variable of the
// strategy and returns the checkpoint's metadata. The checkpoint may come
// from a strategy with any number of replicas, ps tasks or shards: it holds
// one tensor per variable, and each copy or shard reads what it holds of it.
//
// Before any variable changes, the checkpoint's index is checked against the
// model; disagreements are reported together in a *MismatchError. By
// default every variable must be in the checkpoint and every tensor of the
// checkpoint must be taken (see WithAllowPartial). A variable saved as
// slices that do not cover it is an *IncompleteError.
func (s *Saver) Restore(ctx context.Context, prefix string) (Metadata, error) {
	ix, err := readIndex(prefix)
	if err != nil {
		return nil, err
	}
	restore, err := s.plan(prefix, ix, s.st.Saveables())
	if err != nil {
		return nil, err
	}
	var mdKeys []string
	var mdTypes []tf.DataType
	for _, name := range slices.Sorted(maps.Keys(ix.entries)) {
		if key, ok := strings.CutPrefix(name, MetadataPrefix); ok {
			mdKeys = append(mdKeys, key)
			mdTypes = append(mdTypes, ix.entries[name].DType)
		}
	}
	if len(restore) == 0 && len(mdKeys) == 0 {
		return Metadata{}, nil
	}
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sig := signature(restore, mdKeys, mdTypes)
	g, ok := s.restores[sig]
	if !ok {
		if g, err = s.buildRestore(restore, mdKeys, mdTypes); err != nil {
			return nil, err
		}
		s.restores[sig] = g
	}
	pt, err := tf.NewTensor(prefix)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: restore %s: %w", prefix, err)
	}
	out, err := s.st.Run(ctx, map[tf.Output]*tf.Tensor{g.prefix: pt}, g.meta, []*tf.Operation{g.target}, func() {
		for _, done := range g.done {
			done()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: restore %s: %w", prefix, err)
	}
	md := Metadata{}
	for i, k := range mdKeys {
		md[k] = tensorutil.Value(out[i])
	}
	s.cfg.log.Debug("checkpoint restored", zap.String("prefix", prefix), zap.Int("variables", len(restore)),
		zap.Int("metadata", len(mdKeys)), zap.Duration("took", time.Since(start)))
	return md, nil
}

// plan checks the checkpoint against the model and returns what to
// restore.
func (s *Saver) plan(prefix string, ix *index, items []strategy.Saveable) ([]strategy.Saveable, error) {
	merr := &MismatchError{Prefix: prefix}
	taken := map[string]bool{}
	var restore []strategy.Saveable
	for _, v := range items {
		ent, ok := ix.entries[v.Name]
		if !ok {
			merr.Missing = append(merr.Missing, v.Name)
			continue
		}
		taken[v.Name] = true
		if !ent.fits(v) {
			merr.Mismatched = append(merr.Mismatched, Mismatch{Name: v.Name, CheckpointDType: ent.DType,
				CheckpointShape: ent.Shape, ModelDType: v.DType, ModelShape: v.Shape})
			continue
		}
		if err := ent.complete(prefix); err != nil {
			return nil, err
		}
		restore = append(restore, withCopies(ix, v))
	}
	for _, name := range slices.Sorted(maps.Keys(ix.entries)) {
		if !taken[name] && !strings.HasPrefix(name, MetadataPrefix) && !strings.HasPrefix(name, CopiesPrefix) {
			merr.Unused = append(merr.Unused, name)
		}
	}
	if len(merr.Mismatched) > 0 || !s.cfg.allowPartial && (len(merr.Missing) > 0 || len(merr.Unused) > 0) {
		return nil, merr
	}
	if len(merr.Missing) > 0 || len(merr.Unused) > 0 {
		s.cfg.log.Info("partial restore", zap.String("prefix", prefix),
			zap.Strings("missing", merr.Missing), zap.Strings("unused", merr.Unused))
	}
	return restore, nil
}

// withCopies returns v to restore from the replicas' copies that ix holds,
// when it holds them from as many replicas; otherwise v as it is, which
// gives every replica the saved value.
func withCopies(ix *index, v strategy.Saveable) strategy.Saveable {
	c := v.Copies
	if c == nil {
		return v
	}
	ent, ok := ix.entries[CopiesPrefix+v.Name]
	if !ok || ent.DType != v.DType || !slices.Equal(ent.Shape, append([]int64{int64(c.Replicas)}, v.Shape...)) {
		return v
	}
	return strategy.Saveable{Name: ent.Name, DType: ent.DType, Shape: ent.Shape, Variable: v.Variable, Slices: []strategy.SaveSlice{c.SaveSlice}}
}

// saveDevice returns the device that saves slice sl of v.
func (s *Saver) saveDevice(v strategy.Saveable, sl strategy.SaveSlice) string {
	if s.cfg.shard != nil {
		if d := s.cfg.shard(v); d != "" {
			return d
		}
	}
	return sl.Device
}

func (s *Saver) buildSave(items []strategy.Saveable, mdKeys []string, mdTypes []tf.DataType) (*saveGraph, error) {
	g := &saveGraph{}
	host := s.st.HostDevice()
	err := s.st.Extend("checkpoint_save", func(sc *op.Scope) error {
		hs := sc.WithDevice(host)
		g.prefix = op.Placeholder(hs.SubScope("prefix"), tf.String, op.PlaceholderShape(tf.ScalarShape()))
		var shards SaveShards
		for i, v := range items {
			for k, sl := range v.Slices {
				val, err := sl.Read(sc.SubScope(fmt.Sprintf("var_%d_%d", i, k)))
				if err != nil {
					return err
				}
				shards.Add(s.saveDevice(v, sl), v.Name, sl.Spec, val)
			}
			if c := v.Copies; c != nil {
				val, err := c.Read(sc.SubScope(fmt.Sprintf("var_%d_copies", i)))
				if err != nil {
					return err
				}
				shards.Add(c.Device, CopiesPrefix+v.Name, "", val)
			}
		}
		for i, k := range mdKeys {
			p := op.Placeholder(hs.SubScope(fmt.Sprintf("metadata_%d", i)), mdTypes[i], op.PlaceholderShape(tf.ScalarShape()))
			g.meta = append(g.meta, p)
			shards.Add(host, MetadataPrefix+k, "", p)
		}
		if shards.Len() == 0 {
			return errors.New("nothing to save: the strategy has no variables and no metadata was given")
		}
		g.shards = shards.Len()
		g.target = shards.Build(sc, hs, g.prefix)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: build save: %w", err)
	}
	return g, nil
}

// buildRestore reads, on each device that holds slices, the slices it
// holds (one RestoreV2 per device), and the metadata on the host.
func (s *Saver) buildRestore(items []strategy.Saveable, mdKeys []string, mdTypes []tf.DataType) (*restoreGraph, error) {
	g := &restoreGraph{}
	host := s.st.HostDevice()
	err := s.st.Extend("checkpoint_restore", func(sc *op.Scope) error {
		hs := sc.WithDevice(host)
		g.prefix = op.Placeholder(hs.SubScope("prefix"), tf.String, op.PlaceholderShape(tf.ScalarShape()))
		var reads restoreReads
		for _, v := range items {
			for _, sl := range v.Slices {
				reads.add(v.Name, v.DType, sl)
				g.done = append(g.done, sl.Restored)
			}
		}
		assigns, err := reads.build(sc, g.prefix)
		if err != nil {
			return err
		}
		if len(mdKeys) > 0 {
			names := make([]string, len(mdKeys))
			for i, k := range mdKeys {
				names[i] = MetadataPrefix + k
			}
			g.meta = op.RestoreV2(hs.SubScope("metadata"), g.prefix, op.Const(hs.SubScope("names"), names),
				op.Const(hs.SubScope("slices"), make([]string, len(names))), mdTypes)
		}
		g.target = op.NoOp(hs.SubScope("done").WithControlDependencies(assigns...))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: build restore: %w", err)
	}
	return g, nil
}

// restoreReads gathers the slices of a restore by the device that reads
// them.
type restoreReads struct {
	order []string
	byDev map[string][]restoreRead
}

type restoreRead struct {
	name  string
	dtype tf.DataType
	slice strategy.SaveSlice
}

// add reads slice sl of the tensor name on the slice's device.
func (r *restoreReads) add(name string, dtype tf.DataType, sl strategy.SaveSlice) {
	if r.byDev == nil {
		r.byDev = map[string][]restoreRead{}
	}
	if _, ok := r.byDev[sl.Device]; !ok {
		r.order = append(r.order, sl.Device)
	}
	r.byDev[sl.Device] = append(r.byDev[sl.Device], restoreRead{name, dtype, sl})
}

// build reads every slice with one RestoreV2 per device and writes it.
func (r *restoreReads) build(sc *op.Scope, prefix tf.Output) ([]*tf.Operation, error) {
	var assigns []*tf.Operation
	for i, dev := range r.order {
		ds := sc.SubScope(fmt.Sprintf("shard_%d", i)).WithDevice(dev)
		rs := r.byDev[dev]
		names, specs, dtypes := make([]string, len(rs)), make([]string, len(rs)), make([]tf.DataType, len(rs))
		for j, w := range rs {
			names[j], specs[j], dtypes[j] = w.name, w.slice.Spec, w.dtype
		}
		vals := op.RestoreV2(ds.SubScope("restore"), prefix, op.Const(ds.SubScope("names"), names),
			op.Const(ds.SubScope("slices"), specs), dtypes)
		if err := sc.Err(); err != nil {
			return nil, err
		}
		for j, w := range rs {
			ops, err := w.slice.Write(ds.SubScope(fmt.Sprintf("write_%d", j)), vals[j])
			if err != nil {
				return nil, fmt.Errorf("variable %q: %w", w.name, err)
			}
			assigns = append(assigns, ops...)
		}
	}
	return assigns, nil
}

// Encode validates md and returns its keys, sorted, and their values as
// scalar tensors (int64, float64 or string), as a checkpoint stores them.
func (md Metadata) Encode() ([]string, []*tf.Tensor, error) {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals := make([]*tf.Tensor, len(keys))
	for i, k := range keys {
		if k == "" {
			return nil, nil, errors.New("checkpoint: metadata: empty key")
		}
		var v any
		switch x := md[k].(type) {
		case int64, float64, string:
			v = x
		case int:
			v = int64(x)
		case int32:
			v = int64(x)
		case uint32:
			v = int64(x)
		case float32:
			v = float64(x)
		default:
			return nil, nil, fmt.Errorf("checkpoint: metadata %q: value of type %T, expected int64, float64 or string", k, md[k])
		}
		t, err := tf.NewTensor(v)
		if err != nil {
			return nil, nil, fmt.Errorf("checkpoint: metadata %q: %w", k, err)
		}
		vals[i] = t
	}
	return keys, vals, nil
}

func dtypesOf(ts []*tf.Tensor) []tf.DataType {
	out := make([]tf.DataType, len(ts))
	for i, t := range ts {
		out[i] = t.DataType()
	}
	return out
}

// signature identifies a set of tensors and metadata for caching ops.
// Names identify tensors, since a strategy never removes a variable.
func signature(items []strategy.Saveable, keys []string, dtypes []tf.DataType) string {
	var b strings.Builder
	for _, v := range items {
		fmt.Fprintf(&b, "%q/%d/%t,", v.Name, len(v.Slices), v.Copies != nil)
	}
	b.WriteByte('|')
	for i, k := range keys {
		fmt.Fprintf(&b, "%q:%d,", k, dtypes[i])
	}
	return b.String()
}
