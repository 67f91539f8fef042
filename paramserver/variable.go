package paramserver

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
)

// FixedShards splits every variable into n shards, as
// tf.distribute.experimental.partitioners.FixedShardsPartitioner. A
// variable with fewer than n rows is an error.
func FixedShards(n int) strategy.Partitioner { return fixedShards(n) }

type fixedShards int

// NumShards implements Partitioner.
func (f fixedShards) NumShards(shape []int64, _ tf.DataType) (int, error) {
	if f < 1 {
		return 0, fmt.Errorf("FixedShards(%d): expected at least 1 shard", int(f))
	}
	return int(f), nil
}

// MaxShardBytes splits a variable into as few shards as keep each under
// maxBytes, at most maxShards of them (0: no limit) and never more than it
// has rows, as tf.distribute.experimental.partitioners.MaxSizePartitioner.
func MaxShardBytes(maxBytes int64, maxShards int) strategy.Partitioner {
	return maxShardBytes{max: maxBytes, shards: maxShards}
}

type maxShardBytes struct {
	max    int64
	shards int
}

// NumShards implements Partitioner.
func (m maxShardBytes) NumShards(shape []int64, dtype tf.DataType) (int, error) {
	if m.max < 1 {
		return 0, fmt.Errorf("MaxShardBytes(%d, %d): expected a positive byte limit", m.max, m.shards)
	}
	if len(shape) == 0 || shape[0] == 0 {
		return 1, nil
	}
	size := dtypeSize(dtype)
	if size == 0 {
		return 0, fmt.Errorf("MaxShardBytes: dtype %s has no fixed size", graphutil.DTypeName(dtype))
	}
	row := size
	for _, d := range shape[1:] {
		row *= d
	}
	rowsPerShard := max(m.max/max(row, 1), 1)
	n := (shape[0] + rowsPerShard - 1) / rowsPerShard
	if m.shards > 0 {
		n = min(n, int64(m.shards))
	}
	return int(min(n, shape[0])), nil
}

func dtypeSize(dt tf.DataType) int64 {
	switch dt {
	case tf.Float, tf.Int32, tf.Uint32:
		return 4
	case tf.Double, tf.Int64, tf.Uint64:
		return 8
	case tf.Half, tf.Bfloat16, tf.Int16, tf.Uint16:
		return 2
	case tf.Int8, tf.Uint8, tf.Bool:
		return 1
	}
	return 0
}

// shardLayout splits rows into n shards of consecutive rows, the first rows%n
// one row longer: TensorFlow's "div" layout. It returns each shard's first
// row and row count.
func shardLayout(rows int64, n int) (offsets, sizes []int64) {
	q, r := rows/int64(n), rows%int64(n)
	var off int64
	for k := range int64(n) {
		size := q
		if k < r {
			size++
		}
		offsets, sizes = append(offsets, off), append(sizes, size)
		off += size
	}
	return offsets, sizes
}

// Variable is a variable of a parameter-server strategy: it lives on the ps
// tasks, in one piece on one of them or split into shards along its first
// axis, each shard on a ps task. A step reads it as one tensor
// (Replica.Read) or looks rows of it up (Replica.Lookup), and
// checkpoints hold it as one tensor.
//
// Shards hold consecutive rows; when the rows do not divide evenly, the
// first shards hold one row more (TensorFlow's "div" layout).
//
// An OnRead variable (a metric, BatchNorm's moving statistics) is one
// variable like any other: the workers' steps write it in turn, as they
// update every variable.
type Variable struct {
	s         *Strategy
	name      string
	dtype     tf.DataType
	shape     []int64
	sync      strategy.Synchronization
	agg       strategy.Aggregation
	trainable bool
	shards    []*shard
}

var _ strategy.Variable = (*Variable)(nil)

// shard is one piece of a variable, on one ps task.
type shard struct {
	v      *Variable
	index  int
	offset int64 // first row in the whole variable
	rows   int64
	ps     int    // position of its ps task
	device string // its ps task's CPU:0
	shared string // the VarHandleOp's shared_name
	h0     tf.Output
	init   *tf.Operation
	inited bool
}

// shape returns the shard's shape.
func (sh *shard) shape() []int64 {
	if len(sh.v.shape) == 0 {
		return nil
	}
	return append([]int64{sh.rows}, sh.v.shape[1:]...)
}

// viewName names the shard for optimizers: its slots are named after it.
func (sh *shard) viewName() string {
	if len(sh.v.shards) == 1 {
		return sh.v.name
	}
	return fmt.Sprintf("%s/part_%d", sh.v.name, sh.index)
}

// sliceSpec is the shard's place in the whole variable as TensorFlow's
// checkpoints write it ("10 4 0,5:-"); "" for an unsharded variable.
func (sh *shard) sliceSpec() string {
	return sliceSpec(sh.v.shape, sh.offset, sh.rows, len(sh.v.shards))
}

func sliceSpec(full []int64, offset, rows int64, shards int) string {
	if shards == 1 {
		return ""
	}
	s := ""
	for _, d := range full {
		s += fmt.Sprintf("%d ", d)
	}
	s += fmt.Sprintf("%d,%d", offset, rows)
	for range full[1:] {
		s += ":-"
	}
	return s
}

// Name returns the variable's name, its key in checkpoints.
func (v *Variable) Name() string { return v.name }

// DType returns the element type.
func (v *Variable) DType() tf.DataType { return v.dtype }

// Shape returns the shape of the whole variable.
func (v *Variable) Shape() []int64 { return append([]int64(nil), v.shape...) }

// Synchronization returns the synchronization the variable was created
// with.
func (v *Variable) Synchronization() strategy.Synchronization { return v.sync }

// Aggregation returns the aggregation the variable was created with.
func (v *Variable) Aggregation() strategy.Aggregation { return v.agg }

// Trainable reports whether Minimize may update the variable.
func (v *Variable) Trainable() bool { return v.trainable }

// NumShards returns the number of shards (1 for a variable in one piece).
func (v *Variable) NumShards() int { return len(v.shards) }

// ShardInfo describes one shard of a variable.
type ShardInfo struct {
	// Device is the ps device that holds the shard.
	Device string
	// Offset is the shard's first row in the whole variable; Rows its
	// number of rows.
	Offset, Rows int64
}

// Shards describes the variable's shards in row order.
func (v *Variable) Shards() []ShardInfo {
	out := make([]ShardInfo, len(v.shards))
	for i, sh := range v.shards {
		out[i] = ShardInfo{Device: sh.device, Offset: sh.offset, Rows: sh.rows}
	}
	return out
}

// String returns the name, type, shape and number of shards.
func (v *Variable) String() string {
	return fmt.Sprintf("%s:%s%v/%d", v.name, graphutil.DTypeName(v.dtype), v.shape, len(v.shards))
}

// scope creates variables on the ps tasks. It is valid only inside the
// function given to Strategy.Scope.
type scope struct {
	s      *Strategy
	closed bool
}

// Variable creates a variable named name (unique within the strategy; its
// checkpoint key) of the given type and shape. init builds its whole initial
// value; the chief computes it once, when Scope returns, and each shard
// receives its rows. Each piece goes to the next ps task in round-robin
// order: a variable in one piece takes one turn, a sharded one a turn per
// shard. strategy.WithPartitioner overrides the strategy's partitioner.
func (sc *scope) Variable(name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (strategy.Variable, error) {
	if sc == nil || sc.closed {
		return nil, strategy.ErrScopeClosed
	}
	v, err := sc.s.newVariable(name, dtype, shape, init, opts...)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// NumReplicasInSync returns the number of workers.
func (sc *scope) NumReplicasInSync() int { return len(sc.s.workers) }

func (s *Strategy) newVariable(name string, dtype tf.DataType, shape []int64, init strategy.Initializer, opts ...strategy.VariableOption) (*Variable, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("paramserver: variable %q: %s", name, fmt.Sprintf(format, args...))
	}
	cfg, err := strategy.NewVariableConfig(name, shape, append([]strategy.VariableOption{strategy.WithPartitioner(s.cfg.partitioner)}, opts...)...)
	if err != nil {
		return nil, err
	}
	if _, dup := s.byName[name]; dup {
		return nil, fail("already used; names must be unique")
	}
	if init == nil {
		return nil, fail("nil initializer")
	}
	n := 1
	if cfg.Partitioner != nil {
		if n, err = cfg.Partitioner.NumShards(shape, dtype); err != nil {
			return nil, fail("partitioner: %v", err)
		}
		switch {
		case n < 1:
			return nil, fail("the partitioner asks for %d shards, expected at least 1", n)
		case n > 1 && len(shape) == 0:
			return nil, fail("the partitioner asks for %d shards of a scalar; only variables with at least one dimension can be sharded", n)
		case len(shape) > 0 && int64(n) > shape[0]:
			return nil, fail("the partitioner asks for %d shards of %d rows (shape %v), expected at most one shard per row", n, shape[0], shape)
		}
	}
	v := &Variable{s: s, name: name, dtype: dtype, shape: append([]int64(nil), shape...), sync: cfg.Synchronization,
		agg: cfg.Aggregation, trainable: cfg.Trainable}
	offsets, sizes := []int64{0}, []int64{0}
	if len(shape) > 0 {
		offsets, sizes = shardLayout(shape[0], n)
	}
	sc := s.newScope0("ps_var/" + name)
	err = graphutil.Safely(func() error {
		val, err := init.Build(sc.SubScope("initial_value").WithDevice(s.host), dtype, shape)
		if err != nil {
			return err
		}
		for k := range n {
			ps := s.nextPS % len(s.ps)
			s.nextPS++
			sh := &shard{v: v, index: k, offset: offsets[k], rows: sizes[k], ps: ps, device: s.ps[ps]}
			sh.shared = "ps/" + sh.viewName()
			ks := sc.SubScope(fmt.Sprintf("part_%d", k))
			sh.h0 = op.VarHandleOp(ks.WithDevice(sh.device), dtype, tf.MakeShape(sh.shape()...), op.VarHandleOpSharedName(sh.shared))
			part := val
			if n > 1 {
				hs := ks.SubScope("slice").WithDevice(s.host)
				begin := make([]int64, len(shape))
				size := make([]int64, len(shape))
				begin[0], size[0] = sh.offset, sh.rows
				for d := 1; d < len(shape); d++ {
					size[d] = -1
				}
				part = op.Slice(hs, val, op.Const(hs.SubScope("begin"), begin), op.Const(hs.SubScope("size"), size))
			}
			sh.init = op.AssignVariableOp(ks.SubScope("init").WithDevice(sh.device), sh.h0, part)
			v.shards = append(v.shards, sh)
		}
		return sc.Err()
	})
	if err != nil {
		return nil, fail("%v", err)
	}
	s.vars = append(s.vars, v)
	s.byName[name] = v
	for _, sh := range v.shards {
		s.pending = append(s.pending, pendingInit{op: sh.init, done: func() { sh.inited = true }, inited: func() bool { return sh.inited }})
	}
	return v, nil
}
