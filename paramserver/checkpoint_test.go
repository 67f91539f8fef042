package paramserver

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/pyenv"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// recModel is a tiny recommender: a user embedding table sharded over the
// ps tasks, updated sparsely, and a dense projection trained with Adam.
type recModel struct {
	emb, proj strategy.Variable
	fn        *Function
}

func newRecModel(t *testing.T, s *Strategy, shards int) *recModel {
	t.Helper()
	m := &recModel{}
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		if m.emb, err = sc.Variable("user_emb", tf.Float, []int64{9, 4}, strategy.Constant(tensor(t, table(9, 4))), strategy.WithPartitioner(FixedShards(shards))); err != nil {
			return err
		}
		m.proj, err = sc.Variable("proj", tf.Float, []int64{4, 1}, strategy.Constant(tensor(t, [][]float32{{0.1}, {-0.2}, {0.3}, {0.05}})),
			strategy.WithPartitioner(FixedShards(shards)))
		return err
	}))
	spec := strategy.InputSpec{"users": {DType: tf.Int32, Shape: []int64{-1}}, "y": {DType: tf.Float, Shape: []int64{-1, 1}}}
	var err error
	m.fn, err = s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		u, err := rc.Lookup(m.emb, in["users"])
		if err != nil {
			return nil, err
		}
		sc := rc.Scope()
		d := op.Sub(sc.SubScope("d"), op.MatMul(sc.SubScope("mm"), u, strategy.MustRead(rc, m.proj)), in["y"])
		loss := rc.AverageLoss(op.Mul(sc.SubScope("sq"), d, d))
		return strategy.Outputs{"loss": loss}, rc.Minimize(optimizer.NewAdam(optimizer.Constant(0.01)), loss, []strategy.Variable{m.emb, m.proj},
			strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: 0.01}))
	})
	require.NoError(t, err)
	return m
}

func (m *recModel) train(t *testing.T, ctx context.Context, c *Coordinator, steps int) {
	t.Helper()
	for i := range steps {
		in := dataset.Element{"users": tensor(t, []int32{int32(i % 9), int32((i + 4) % 9)}), "y": tensor(t, [][]float32{{1}, {-1}})}
		_, err := c.Schedule(m.fn, Feed(in))
		require.NoError(t, err)
	}
	require.NoError(t, c.Join(ctx))
}

// values reads every variable and slot of s as the checkpoint sees them.
func values(t *testing.T, ctx context.Context, s *Strategy, names ...string) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, v := range s.Variables() {
		x, err := s.Value(ctx, v)
		require.NoError(t, err)
		out[v.Name()] = x.Value()
	}
	for _, name := range names {
		sv := s.slots[name]
		require.NotNil(t, sv, "slot %s", name)
		s.mu.Lock()
		sc := s.newScope0("read_slot")
		sorted := append([]*slotPart(nil), sv.parts...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].offset < sorted[j].offset })
		var parts []tf.Output
		for _, p := range sorted {
			parts = append(parts, op.ReadVariableOp(sc.SubScope("read").WithDevice(p.device), p.h0, sv.dtype))
		}
		r := parts[0]
		if len(parts) > 1 {
			r = op.ConcatV2(sc.SubScope("concat"), parts, op.Const(sc.SubScope("axis"), int32(0)))
		}
		require.NoError(t, sc.Err())
		s.mu.Unlock()
		x, err := s.run0(ctx, nil, []tf.Output{r}, nil)
		require.NoError(t, err)
		out[name] = x[0].Value()
	}
	return out
}

// A checkpoint saved from two ps tasks, the embedding table in two shards,
// restores into one ps task (one shard) and into three (three shards): every
// variable, the Adam slots and step count, and the applied-steps counter
// come back, and training goes on. The table is one tensor in the
// checkpoint, and Python's tf.train.load_checkpoint reads every variable
// and slot, element by element, as the job holds them.
func TestCheckpointRestoresIntoOtherNumbersOfPS(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	slots := []string{"proj/Adam/m", "proj/Adam/v", "Adam/iterations"} // proj's slots are sharded as proj is
	dir := t.TempDir()

	s2 := newInProcess(t, 1, 2)
	m2 := newRecModel(t, s2, 2)
	c2 := newCoordinator(t, s2)
	m2.train(t, ctx, c2, 12)
	mgr, err := checkpoint.NewManager(s2, dir, checkpoint.WithMaxToKeep(2))
	require.NoError(t, err)
	prefix, err := mgr.Save(ctx, 12, checkpoint.Metadata{"epoch": int64(3)})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "ckpt-12"), prefix)
	want := values(t, ctx, s2, slots...)
	assert.EqualValues(t, 12, want["Adam/iterations"])

	entries, err := checkpoint.List(prefix)
	require.NoError(t, err)
	shapes := map[string][]int64{}
	for _, e := range entries {
		shapes[e.Name] = e.Shape
	}
	assert.Equal(t, []int64{9, 4}, shapes["user_emb"], "the sharded table is one tensor")
	assert.Equal(t, []int64{4, 1}, shapes["proj/Adam/m"])
	assert.Contains(t, shapes, AppliedStepsKey)
	readInPython(t, prefix, want)

	for _, ps := range []int{1, 3} {
		s := newInProcess(t, 1, ps)
		m := newRecModel(t, s, ps)
		require.Equal(t, ps, psVar(m.emb).NumShards())
		mgrN, err := checkpoint.NewManager(s, dir)
		require.NoError(t, err)
		step, md, err := mgrN.RestoreLatest(ctx)
		require.NoError(t, err, "%d ps", ps)
		assert.EqualValues(t, 12, step)
		assert.Equal(t, int64(3), md["epoch"])
		assert.Equal(t, want, values(t, ctx, s, slots...), "%d ps", ps)
		applied, err := s.AppliedSteps(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 12, applied)
		c := newCoordinator(t, s)
		m.train(t, ctx, c, 3)
		applied, err = s.AppliedSteps(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 15, applied, "training goes on from the restored state")
	}
}

// readInPython checks that Python TensorFlow reads every value of want
// from the checkpoint at prefix, element by element.
func readInPython(t *testing.T, prefix string, want map[string]any) {
	got := pyenv.ReadCheckpoint(t, prefix)
	for name, v := range want {
		py, ok := got[name]
		require.True(t, ok, "Python reads %s", name)
		x, err := tf.NewTensor(v)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(x.Shape()), fmt.Sprint(py.Shape), "shape of %s", name)
		assert.Equal(t, flat(t, x), py.Values, "values of %s", name)
	}
}

// flat returns the elements of x, a float32 tensor or an int64 scalar, as
// float64s.
func flat(t *testing.T, x *tf.Tensor) []float64 {
	if x.DataType() == tf.Int64 && len(x.Shape()) == 0 {
		return []float64{float64(x.Value().(int64))}
	}
	f := tensorutil.Float32s(x)
	require.NotNil(t, f, "a float32 tensor")
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// A checkpoint that does not fit the model is refused before anything
// changes, with every disagreement named.
func TestRestoreMismatchIsRefused(t *testing.T) {
	ctx := testContext(t, time.Minute)
	a := newInProcess(t, 1, 1)
	require.NoError(t, a.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("x", tf.Float, []int64{3}, strategy.Zeros())
		return err
	}))
	prefix := filepath.Join(t.TempDir(), "ckpt")
	sa, err := checkpoint.NewSaver(a)
	require.NoError(t, err)
	require.NoError(t, sa.Save(ctx, prefix, nil))

	b := newInProcess(t, 1, 1)
	require.NoError(t, b.Scope(func(sc strategy.Scope) error {
		if _, err := sc.Variable("x", tf.Float, []int64{4}, strategy.Constant(tensor(t, []float32{1, 2, 3, 4}))); err != nil {
			return err
		}
		_, err := sc.Variable("y", tf.Float, []int64{1}, strategy.Zeros())
		return err
	}))
	sb, err := checkpoint.NewSaver(b)
	require.NoError(t, err)
	_, err = sb.Restore(ctx, prefix)
	var me *checkpoint.MismatchError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, []string{"y"}, me.Missing)
	require.Len(t, me.Mismatched, 1)
	assert.Equal(t, "x", me.Mismatched[0].Name)
	x, err := b.Value(ctx, b.Variables()[0])
	require.NoError(t, err)
	assert.Equal(t, []float32{1, 2, 3, 4}, x.Value(), "nothing changed")
}
