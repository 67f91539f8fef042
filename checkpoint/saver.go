package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/strategy"
)

// Engine is what a Saver needs from a strategy. *strategy.InGraph provides
// it, and so do mirrored.Strategy and every strategy built on it.
type Engine interface {
	// Variables returns every variable, optimizer slots included.
	Variables() []strategy.Variable
	// NewScope returns a fresh scope over the engine's graph; the caller
	// holds Lock.
	NewScope(name string) *op.Scope
	// RunOps runs ops in the engine's session.
	RunOps(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) ([]*tf.Tensor, error)
	// Lock and Unlock keep steps from running while ops are built.
	Lock()
	Unlock()
	// RunOpsInitializing runs ops that restore vs and, on success, marks vs
	// initialised under the same lock so their initialisers never re-run.
	RunOpsInitializing(ctx context.Context, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation, vs ...strategy.Variable) ([]*tf.Tensor, error)
	// HostDevice is where SaveV2 and RestoreV2 run.
	HostDevice() string
	// Devices are the local replicas' devices.
	Devices() []string
	// NumReplicasInSync is the number of replicas across all workers.
	NumReplicasInSync() int
}

var _ Engine = (*strategy.InGraph)(nil)

// configurer is implemented by *strategy.InGraph; a Saver uses the
// strategy's CrossDeviceOps to aggregate OnRead variables across workers.
type configurer interface{ Config() strategy.Config }

// MetadataPrefix prefixes the checkpoint keys of metadata. Variable names
// cannot start with '_', so metadata never collides with a variable.
const MetadataPrefix = "_tfdist/metadata/"

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
	e   Engine
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
}

// NewSaver returns a Saver of e's variables. Options: WithLogger,
// WithSharding, WithAllowPartial.
func NewSaver(e Engine, opts ...Option) (*Saver, error) {
	if e == nil {
		return nil, errors.New("checkpoint: NewSaver: nil engine")
	}
	return &Saver{e: e, cfg: newConfig(opts), saves: map[string]*saveGraph{}, restores: map[string]*restoreGraph{}}, nil
}

// Save writes every variable of the strategy, and md, to the checkpoint
// prefix: <prefix>.index and <prefix>.data-<shard>-of-<shards>, created with
// their directory if need be and replaced if they exist. An OnWrite variable
// is saved from its primary copy; an OnRead variable as the aggregate of its
// copies (their sum or mean, or copy 0 for AggregationOnlyFirstReplica),
// computed by TensorFlow. Save writes the files in place: use a Manager for
// checkpoints that a crash mid-write must not damage.
func (s *Saver) Save(ctx context.Context, prefix string, md Metadata) error {
	if prefix == "" {
		return errors.New("checkpoint: Save: empty prefix")
	}
	keys, vals, err := md.Encode()
	if err != nil {
		return err
	}
	start := time.Now()
	vars, err := copiesOf(s.e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sig := signature(vars, keys, dtypesOf(vals))
	g, ok := s.saves[sig]
	if !ok {
		if g, err = s.buildSave(vars, keys, dtypesOf(vals)); err != nil {
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
	if _, err := s.e.RunOps(ctx, feeds, nil, []*tf.Operation{g.target}); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", prefix, err)
	}
	s.cfg.log.Debug("checkpoint written", zap.String("prefix", prefix), zap.Int("variables", len(vars)),
		zap.Int("metadata", len(keys)), zap.Int("shards", g.shards), zap.Duration("took", time.Since(start)))
	return nil
}

// Restore reads the checkpoint at prefix into every variable of the
// strategy — into every copy of each, on each replica's device — and
// returns the checkpoint's metadata. The checkpoint may come from a strategy
// with any number of replicas: it holds one value per variable. An OnRead
// variable with AggregationSum gets value/replicas in each copy, so that its
// sum is the saved value, as in TensorFlow.
//
// Before any variable changes, the checkpoint's index is checked against the
// model; disagreements are reported together in a *MismatchError. By
// default every variable must be in the checkpoint and every tensor of the
// checkpoint must be taken (see WithAllowPartial).
func (s *Saver) Restore(ctx context.Context, prefix string) (Metadata, error) {
	ix, err := readIndex(prefix)
	if err != nil {
		return nil, err
	}
	vars, err := copiesOf(s.e)
	if err != nil {
		return nil, err
	}
	restore, err := s.plan(prefix, ix, vars)
	if err != nil {
		return nil, err
	}
	var mdKeys []string
	var mdTypes []tf.DataType
	for _, name := range sortedNames(ix.entries) {
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
	restored := make([]strategy.Variable, len(restore))
	for i, v := range restore {
		restored[i] = v
	}
	out, err := s.e.RunOpsInitializing(ctx, map[tf.Output]*tf.Tensor{g.prefix: pt}, g.meta, []*tf.Operation{g.target}, restored...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: restore %s: %w", prefix, err)
	}
	md := Metadata{}
	for i, k := range mdKeys {
		md[k] = out[i].Value()
	}
	s.cfg.log.Debug("checkpoint restored", zap.String("prefix", prefix), zap.Int("variables", len(restore)),
		zap.Int("metadata", len(mdKeys)), zap.Duration("took", time.Since(start)))
	return md, nil
}

// plan checks the checkpoint against the model and returns the variables to
// restore.
func (s *Saver) plan(prefix string, ix *index, vars []strategy.Copies) ([]strategy.Copies, error) {
	merr := &MismatchError{Prefix: prefix}
	taken := map[string]bool{}
	var restore []strategy.Copies
	for _, v := range vars {
		ent, ok := ix.entries[v.Name()]
		if !ok {
			merr.Missing = append(merr.Missing, v.Name())
			continue
		}
		taken[v.Name()] = true
		if ent.DType != v.DType() || !sameShape(ent.Shape, v.Shape()) {
			merr.Mismatched = append(merr.Mismatched, Mismatch{Name: v.Name(), CheckpointDType: ent.DType,
				CheckpointShape: ent.Shape, ModelDType: v.DType(), ModelShape: v.Shape()})
			continue
		}
		restore = append(restore, v)
	}
	for _, name := range sortedNames(ix.entries) {
		if !taken[name] && !strings.HasPrefix(name, MetadataPrefix) {
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

func (s *Saver) buildSave(vars []strategy.Copies, mdKeys []string, mdTypes []tf.DataType) (*saveGraph, error) {
	s.e.Lock()
	defer s.e.Unlock()
	sc := s.e.NewScope("checkpoint_save")
	host := s.e.HostDevice()
	hs := sc.WithDevice(host)
	g := &saveGraph{}
	var shards SaveShards
	err := safely(func() error {
		g.prefix = op.Placeholder(hs.SubScope("prefix"), tf.String, op.PlaceholderShape(tf.ScalarShape()))
		for i, v := range vars {
			val, err := s.saveValue(sc.SubScope(fmt.Sprintf("var_%d", i)), v)
			if err != nil {
				return err
			}
			dev := host
			if s.cfg.shard != nil {
				if d := s.cfg.shard(v); d != "" {
					dev = d
				}
			}
			shards.Add(dev, v.Name(), "", val)
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
		return sc.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: build save: %w", err)
	}
	return g, nil
}

// saveValue returns the value a checkpoint holds for v.
func (s *Saver) saveValue(sc *op.Scope, v strategy.Copies) (tf.Output, error) {
	read := func(r int) tf.Output {
		return op.ReadVariableOp(sc.SubScope(fmt.Sprintf("read_%d", r)).WithDevice(s.deviceOf(v, r)), v.Handle(r), v.DType())
	}
	global := s.e.NumReplicasInSync()
	if v.Synchronization() == strategy.OnWrite || v.Aggregation() == strategy.AggregationOnlyFirstReplica ||
		v.NumCopies() == 1 && global == 1 {
		return read(0), nil
	}
	if v.Aggregation() != strategy.AggregationSum && v.Aggregation() != strategy.AggregationMean {
		return tf.Output{}, fmt.Errorf("variable %q is OnRead with aggregation %v: its copies have no single value to save; "+
			"give it AggregationSum, AggregationMean or AggregationOnlyFirstReplica", v.Name(), v.Aggregation())
	}
	vals := make([]tf.Output, v.NumCopies())
	for r := range vals {
		vals[r] = read(r)
	}
	if global > len(vals) {
		// Copies live on other workers too: reduce with the strategy's
		// collectives, which every worker's save runs.
		c, ok := s.e.(configurer)
		if !ok || c.Config().CrossDeviceOps == nil {
			return tf.Output{}, fmt.Errorf("variable %q is OnRead across %d replicas, %d of them local, and the strategy offers no CrossDeviceOps to aggregate it",
				v.Name(), global, len(vals))
		}
		red := strategy.Sum
		if v.Aggregation() == strategy.AggregationMean {
			red = strategy.Mean
		}
		in := make([][]tf.Output, len(vals))
		for r := range vals {
			in[r] = []tf.Output{vals[r]}
		}
		out, err := c.Config().CrossDeviceOps.BatchReduce(sc.SubScope("cross_worker"), red, in, s.e.Devices())
		if err != nil {
			return tf.Output{}, fmt.Errorf("variable %q: %w", v.Name(), err)
		}
		return out[0][0], nil
	}
	hs := sc.SubScope("aggregate").WithDevice(s.e.HostDevice())
	sum := vals[0]
	if len(vals) > 1 {
		sum = op.AddN(hs.SubScope("sum"), vals)
	}
	if v.Aggregation() == strategy.AggregationMean {
		sum = op.Div(hs.SubScope("mean"), sum,
			op.Cast(hs.SubScope("n"), op.Const(hs.SubScope("count"), int32(global)), v.DType()))
	}
	return sum, nil
}

func (s *Saver) buildRestore(vars []strategy.Copies, mdKeys []string, mdTypes []tf.DataType) (*restoreGraph, error) {
	s.e.Lock()
	defer s.e.Unlock()
	sc := s.e.NewScope("checkpoint_restore")
	hs := sc.WithDevice(s.e.HostDevice())
	g := &restoreGraph{}
	err := safely(func() error {
		g.prefix = op.Placeholder(hs.SubScope("prefix"), tf.String, op.PlaceholderShape(tf.ScalarShape()))
		var names []string
		var dtypes []tf.DataType
		for _, v := range vars {
			names = append(names, v.Name())
			dtypes = append(dtypes, v.DType())
		}
		for i, k := range mdKeys {
			names = append(names, MetadataPrefix+k)
			dtypes = append(dtypes, mdTypes[i])
		}
		vals := op.RestoreV2(hs.SubScope("restore"), g.prefix, op.Const(hs.SubScope("names"), names),
			op.Const(hs.SubScope("slices"), make([]string, len(names))), dtypes)
		if err := sc.Err(); err != nil {
			return err
		}
		var assigns []*tf.Operation
		for i, v := range vars {
			vs := sc.SubScope(fmt.Sprintf("var_%d", i))
			val := s.restoreValue(vs.WithDevice(s.e.HostDevice()), v, vals[i])
			for r := range v.NumCopies() {
				rs := vs.SubScope(fmt.Sprintf("assign_%d", r)).WithDevice(s.deviceOf(v, r))
				assigns = append(assigns, op.AssignVariableOp(rs, v.Handle(r), val))
			}
		}
		g.meta = vals[len(vars):]
		g.target = op.NoOp(hs.SubScope("done").WithControlDependencies(assigns...))
		return sc.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: build restore: %w", err)
	}
	return g, nil
}

// restoreValue returns what each copy of v receives: the saved value, or
// value/replicas for an OnRead variable summed across replicas
// (TensorFlow's get_on_read_restore_ops).
func (s *Saver) restoreValue(sc *op.Scope, v strategy.Copies, val tf.Output) tf.Output {
	n := s.e.NumReplicasInSync()
	if v.Synchronization() != strategy.OnRead || v.Aggregation() != strategy.AggregationSum || n == 1 {
		return val
	}
	switch v.DType() {
	case tf.Float, tf.Double, tf.Half, tf.Bfloat16:
		return op.Div(sc.SubScope("per_replica"), val, op.Cast(sc.SubScope("n"), op.Const(sc.SubScope("count"), int32(n)), v.DType()))
	}
	// Integers: true division then a cast back, as Python's tensor / n.
	d := op.Div(sc.SubScope("per_replica"), op.Cast(sc.SubScope("to_double"), val, tf.Double), op.Const(sc.SubScope("count"), float64(n)))
	return op.Cast(sc.SubScope("back"), d, v.DType())
}

// deviceOf returns the device of copy r of v.
func (s *Saver) deviceOf(v strategy.Copies, r int) string {
	if d := v.Handle(r).Op.Device(); d != "" {
		return d
	}
	if devs := s.e.Devices(); r < len(devs) {
		return devs[r]
	}
	return s.e.HostDevice()
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

// signature identifies a set of variables and metadata for caching ops.
func signature(vars []strategy.Copies, keys []string, dtypes []tf.DataType) string {
	var b strings.Builder
	for _, v := range vars {
		fmt.Fprintf(&b, "%p,", v)
	}
	b.WriteByte('|')
	for i, k := range keys {
		fmt.Fprintf(&b, "%q:%d,", k, dtypes[i])
	}
	return b.String()
}

func sortedNames(m map[string]Entry) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sameShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// safely runs fn and turns a panic (graft panics on ops built from a failed
// scope) into an error.
func safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic while building the graph: %v", p)
		}
	}()
	return fn()
}

// copiesOf returns e's variables with their copies: an in-graph engine's
// variables have them.
func copiesOf(e Engine) ([]strategy.Copies, error) {
	vars := e.Variables()
	out := make([]strategy.Copies, len(vars))
	for i, v := range vars {
		c, ok := v.(strategy.Copies)
		if !ok {
			return nil, fmt.Errorf("checkpoint: variable %q has no local copies to save", v.Name())
		}
		out[i] = c
	}
	return out, nil
}
