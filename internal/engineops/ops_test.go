package engineops_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/engineops"
)

// groups starts a collective group of n members in this process and
// registers each with the collective ops.
func groups(t *testing.T, n int) []string {
	t.Helper()
	ls := make([]net.Listener, n)
	members := make([]collective.Member, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ls[i] = l
		members[i] = collective.Member{Name: fmt.Sprintf("worker:%d", i), Addr: l.Addr().String()}
	}
	ids := make([]string, n)
	gs := make([]*collective.Group, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs[i], errs[i] = collective.New(context.Background(), members, i,
				collective.WithListener(ls[i]), collective.WithTimeout(10*time.Second), collective.WithStartupTimeout(10*time.Second))
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		var unregister func()
		ids[i], unregister = engineops.RegisterGroup(gs[i])
		t.Cleanup(unregister)
	}
	t.Cleanup(func() { // every member closes at once: Close is a barrier
		var wg sync.WaitGroup
		for _, g := range gs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if broken := g.Err() != nil; !broken {
					assert.NoError(t, g.Close(ctx))
					return
				}
				g.Close(ctx)
			}()
		}
		wg.Wait()
	})
	return ids
}

// onMembers builds a graph per member with build and runs them at once,
// returning each member's fetched tensors.
func onMembers(t *testing.T, ids []string, build func(s *op.Scope, member int, group string) []tf.Output) [][]*tf.Tensor {
	t.Helper()
	out, errs := runMembers(t, ids, build)
	for m := range ids {
		require.NoError(t, errs[m], "member %d", m)
	}
	return out
}

// runMembers is onMembers returning each member's run error.
func runMembers(t *testing.T, ids []string, build func(s *op.Scope, member int, group string) []tf.Output) ([][]*tf.Tensor, []error) {
	t.Helper()
	out := make([][]*tf.Tensor, len(ids))
	errs := make([]error, len(ids))
	inSessions(t, ids, func(s *op.Scope, m int, group string) func(*tf.Session) {
		fetches := build(s, m, group)
		return func(sess *tf.Session) { out[m], errs[m] = sess.Run(nil, fetches, nil) }
	})
	return out, errs
}

// inSessions builds a graph per member with build and calls the function
// build returns with the member's session, every member at once.
func inSessions(t *testing.T, ids []string, build func(s *op.Scope, member int, group string) func(*tf.Session)) {
	t.Helper()
	var wg sync.WaitGroup
	for m, id := range ids {
		s := op.NewScope()
		run := build(s, m, id)
		g, err := s.Finalize()
		require.NoError(t, err)
		sess, err := tf.NewSession(g, nil)
		require.NoError(t, err)
		defer sess.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(sess)
		}()
	}
	wg.Wait()
}

// The ops all-reduce, all-gather and broadcast tensors of every supported
// dtype between processes' groups, in one session run, and the results are
// written into the ops' outputs with the inputs' shapes.
func TestCollectiveOpsCombineAcrossGroups(t *testing.T) {
	ids := groups(t, 3)
	out := onMembers(t, ids, func(s *op.Scope, m int, group string) []tf.Output {
		f := float32(m + 1)
		return []tf.Output{
			engineops.AllReduce(s.SubScope("f32"), op.Const(s.SubScope("a"), [][]float32{{f, 2 * f}, {3 * f, 4 * f}}), group, "f32", collective.Sum, 0),
			engineops.AllReduce(s.SubScope("f64"), op.Const(s.SubScope("b"), []float64{float64(m)}), group, "f64", collective.Max, 0),
			engineops.AllReduce(s.SubScope("i64"), op.Const(s.SubScope("c"), []int64{int64(m) - 5, 7}), group, "i64", collective.Min, 0),
			engineops.AllReduce(s.SubScope("i32"), op.Const(s.SubScope("d"), []int32{}), group, "empty", collective.Sum, 0),
			engineops.AllGather(s.SubScope("gather"), op.Const(s.SubScope("e"), rows(m+1, 2)), group, "rows"),
			engineops.Broadcast(s.SubScope("bcast"), op.Const(s.SubScope("f"), []float32{f, f, f}), group, "bcast", 1),
		}
	})
	for m := range ids {
		assert.Equal(t, [][]float32{{6, 12}, {18, 24}}, out[m][0].Value(), "member %d: sum", m)
		assert.Equal(t, []float64{2}, out[m][1].Value(), "member %d: max", m)
		assert.Equal(t, []int64{-5, 7}, out[m][2].Value(), "member %d: min", m)
		assert.Equal(t, []int32{}, out[m][3].Value(), "member %d: empty", m)
		assert.Equal(t, []int64{6, 2}, out[m][4].Shape(), "member %d: gathered rows 1+2+3", m)
		assert.Equal(t, []float32{2, 2, 2}, out[m][5].Value(), "member %d: root 1's value", m)
	}
}

// The reduce-scatter op gives each member its block of the flattened
// all-reduce, of collective.ScatterBlock's length, and the all-gather of
// the blocks, concatenated or put in place, is the all-reduce, bit for
// bit; compressed to int8, its block is that of the all-reduce
// compressed alike.
func TestReduceScatterOpIsTheAllReducesBlock(t *testing.T) {
	ids := groups(t, 3)
	out := onMembers(t, ids, func(s *op.Scope, m int, group string) []tf.Output {
		x := make([][]float32, 4)
		for i := range x {
			x[i] = []float32{float32(m+1) * 1e-3, float32(i) * 1e7, float32(m-i) / 3}
		}
		in := op.Const(s.SubScope("x"), x)
		block := engineops.ReduceScatter(s.SubScope("rs"), in, group, "rs", collective.Sum, 0)
		return []tf.Output{
			engineops.AllReduce(s.SubScope("ar"), in, group, "ar", collective.Sum, 0),
			block,
			engineops.AllGather(s.SubScope("ag"), block, group, "ag"),
			engineops.AllGatherBlocks(s.SubScope("agb"), block, group, "agb", 12),
			engineops.AllReduce(s.SubScope("ar8"), in, group, "ar8", collective.Sum, collective.Int8),
			engineops.ReduceScatter(s.SubScope("rs8"), in, group, "rs8", collective.Sum, collective.Int8),
		}
	})
	for m := range ids {
		var whole []float32
		for _, row := range out[m][0].Value().([][]float32) {
			whole = append(whole, row...)
		}
		start, n := collective.ScatterBlock(12, 3, m)
		assert.Equal(t, whole[start:start+n], out[m][1].Value(), "member %d: its block", m)
		assert.Equal(t, whole, out[m][2].Value(), "member %d: the blocks gathered", m)
		assert.Equal(t, whole, out[m][3].Value(), "member %d: the blocks put in place", m)
		var int8 []float32
		for _, row := range out[m][4].Value().([][]float32) {
			int8 = append(int8, row...)
		}
		assert.NotEqual(t, whole, int8, "member %d: int8 is not exact", m)
		assert.Equal(t, int8[start:start+n], out[m][5].Value(), "member %d: its block in int8", m)
	}
}

// A tensor whose length differs between members fails the run on every
// member with an error naming the tensor.
func TestCollectiveOpMismatchFailsTheRun(t *testing.T) {
	for name, shapes := range map[string][2][]int64{"length": {{3}, {4}}, "shape": {{2, 3}, {3, 2}}} {
		t.Run(name, func(t *testing.T) {
			ids := groups(t, 2)
			_, errs := runMembers(t, ids, func(s *op.Scope, m int, group string) []tf.Output {
				x := op.Fill(s.SubScope("x"), op.Const(s.SubScope("dims"), shapes[m]), op.Const(s.SubScope("one"), float32(1)))
				return []tf.Output{engineops.AllReduce(s, x, group, "grads", collective.Sum, 0)}
			})
			want := fmt.Sprintf(`"grads": worker:0 has float32%s, worker:1 has float32%s`, dims(shapes[0]), dims(shapes[1]))
			for m := range ids {
				require.Error(t, errs[m], "member %d", m)
				assert.Contains(t, errs[m].Error(), want, "member %d", m)
			}
		})
	}
}

// dims writes a shape as the engine's errors do, e.g. [2,3].
func dims(shape []int64) string {
	return strings.ReplaceAll(fmt.Sprint(shape), " ", ",")
}

// rows returns n rows of width w, every element n-1.
func rows(n, w int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		out[i] = make([]int32, w)
		for j := range out[i] {
			out[i][j] = int32(n - 1)
		}
	}
	return out
}

// An all-reduce large enough that the members write their parts into
// each other's outputs (memory both processes map) returns the same sums,
// and a result fetched from one run stays intact while later runs reuse
// that memory: it is given back only once TensorFlow releases the tensor.
func TestSharedOutputsOutliveLaterRuns(t *testing.T) {
	const elems, runs = 1<<20 + 3, 4
	ids := groups(t, 2)
	results := make([][]*tf.Tensor, len(ids))
	inSessions(t, ids, func(s *op.Scope, m int, group string) func(*tf.Session) {
		v := op.Placeholder(s.SubScope("v"), tf.Float, op.PlaceholderShape(tf.ScalarShape()))
		x := op.Fill(s.SubScope("x"), op.Const(s.SubScope("dims"), []int64{elems}), v)
		y := engineops.AllReduce(s, x, group, "big", collective.Sum, 0)
		return func(sess *tf.Session) {
			for r := 1; r <= runs; r++ {
				feed, err := tf.NewTensor(float32((m + 1) * r))
				if !assert.NoError(t, err) {
					return
				}
				out, err := sess.Run(map[tf.Output]*tf.Tensor{v: feed}, []tf.Output{y}, nil)
				if !assert.NoError(t, err, "member %d run %d", m, r) {
					return
				}
				results[m] = append(results[m], out[0])
			}
		}
	})
	for m := range ids {
		require.Len(t, results[m], runs, "member %d", m)
		for r, out := range results[m] {
			got := out.Value().([]float32)
			require.Len(t, got, elems)
			want := float32(3 * (r + 1))
			for i, x := range got {
				if x != want {
					require.Equal(t, want, x, "member %d run %d element %d", m, r+1, i)
				}
			}
		}
	}
}
