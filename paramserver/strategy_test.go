package paramserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/strategy"
)

func TestShardLayoutIsTensorFlowsDivLayout(t *testing.T) {
	for _, c := range []struct {
		rows          int64
		n             int
		offsets, size []int64
	}{
		{10, 1, []int64{0}, []int64{10}},
		{10, 2, []int64{0, 5}, []int64{5, 5}},
		{10, 3, []int64{0, 4, 7}, []int64{4, 3, 3}},
		{5, 5, []int64{0, 1, 2, 3, 4}, []int64{1, 1, 1, 1, 1}},
	} {
		off, size := shardLayout(c.rows, c.n)
		assert.Equal(t, c.offsets, off, "%d rows in %d", c.rows, c.n)
		assert.Equal(t, c.size, size, "%d rows in %d", c.rows, c.n)
	}
	assert.Equal(t, "10 4 4,3:-", sliceSpec([]int64{10, 4}, 4, 3, 3))
	assert.Equal(t, "", sliceSpec([]int64{10, 4}, 0, 10, 1))
}

func TestPartitioners(t *testing.T) {
	n, err := FixedShards(3).NumShards([]int64{10, 4}, tf.Float)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	_, err = FixedShards(0).NumShards([]int64{10}, tf.Float)
	assert.ErrorContains(t, err, "FixedShards(0)")

	// 1000 rows of 16 float32 = 64 KB; 16 KB shards need 4 of them.
	n, err = MaxShardBytes(16<<10, 0).NumShards([]int64{1000, 16}, tf.Float)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	n, err = MaxShardBytes(16<<10, 3).NumShards([]int64{1000, 16}, tf.Float)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "capped by maxShards")
	n, err = MaxShardBytes(1, 0).NumShards([]int64{5, 16}, tf.Float)
	require.NoError(t, err)
	assert.Equal(t, 5, n, "never more shards than rows")
	_, err = MaxShardBytes(0, 0).NumShards([]int64{5}, tf.Float)
	assert.ErrorContains(t, err, "positive byte limit")
}

// A cluster without ps tasks, without a chief or without workers is an
// error that names what is missing, before anything starts.
func TestBadClusters(t *testing.T) {
	ctx := testContext(t, time.Minute)
	for _, c := range []struct {
		jobs map[cluster.TaskType][]string
		task cluster.Task
		want string
	}{
		{map[cluster.TaskType][]string{cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2"}}, cluster.Task{Type: cluster.Chief}, "no ps job"},
		{map[cluster.TaskType][]string{cluster.Worker: {"127.0.0.1:2"}, cluster.PS: {"127.0.0.1:3"}}, cluster.Task{Type: cluster.Worker}, "no chief job"},
		{map[cluster.TaskType][]string{cluster.Chief: {"127.0.0.1:1"}, cluster.PS: {"127.0.0.1:3"}}, cluster.Task{Type: cluster.Chief}, "no worker job"},
	} {
		spec, err := cluster.NewClusterSpec(c.jobs)
		require.NoError(t, err)
		r, err := cluster.NewSimpleResolver(spec, c.task)
		require.NoError(t, err)
		_, err = New(ctx, r)
		assert.ErrorIs(t, err, ErrBadCluster)
		assert.ErrorContains(t, err, c.want)
	}
	local, err := cluster.NewSimpleResolver(cluster.ClusterSpec{}, cluster.Task{})
	require.NoError(t, err)
	_, err = New(ctx, local)
	assert.ErrorIs(t, err, ErrBadCluster)
	assert.ErrorContains(t, err, "tfdist launch --chief --workers 2 --ps 2")
}

// A worker that never comes up fails New within the startup timeout, with an
// error that names it.
func TestWorkerThatNeverComesUp(t *testing.T) {
	ports, err := freeport.Loopback(3)
	require.NoError(t, err)
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {fmt.Sprintf("127.0.0.1:%d", ports[0])}, cluster.Worker: {fmt.Sprintf("127.0.0.1:%d", ports[1])},
		cluster.PS: {fmt.Sprintf("127.0.0.1:%d", ports[2])}})
	require.NoError(t, err)
	ps, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.PS})
	require.NoError(t, err)
	serveCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go Serve(serveCtx, ps)
	// Long enough for the ps task to come up on a loaded machine, so that
	// the worker is the only task missing.
	const startup = 5 * time.Second
	start := time.Now()
	_, err = New(testContext(t, 2*time.Minute), chiefResolver(t, spec), WithStartupTimeout(startup))
	var ue *cluster.UnreachableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, []cluster.Task{{Type: cluster.Worker, Index: 0}}, ue.Tasks)
	// The worker never comes up: New ends at its startup timeout, not with
	// its context, 2 minutes away.
	assert.Less(t, time.Since(start), startup+30*time.Second, "New ends at its %v startup timeout", startup)

	// A context that ends first ends the wait, well before the startup
	// timeout (a new chief: a server keeps its port until the process
	// exits).
	more, err := freeport.Loopback(2)
	require.NoError(t, err)
	spec2, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {fmt.Sprintf("127.0.0.1:%d", more[0])}, cluster.Worker: {fmt.Sprintf("127.0.0.1:%d", more[1])},
		cluster.PS: {fmt.Sprintf("127.0.0.1:%d", ports[2])}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	const timeout = 2 * time.Minute
	start = time.Now()
	_, err = New(ctx, chiefResolver(t, spec2), WithStartupTimeout(timeout))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), timeout/2, "New ends with its context, not at its %v startup timeout", timeout)
}

// psHolds reports whether the ps device holds a variable with the given
// shared name: reading it there succeeds only if it does.
func psHolds(t *testing.T, s *Strategy, device, shared string, dtype tf.DataType) bool {
	t.Helper()
	s.mu.Lock()
	sc := s.newScope0("probe")
	h := op.VarHandleOp(sc.WithDevice(device), dtype, tf.MakeShape(), op.VarHandleOpSharedName(shared))
	r := op.ReadVariableOp(sc.SubScope("read").WithDevice(device), h, dtype)
	require.NoError(t, sc.Err())
	s.mu.Unlock()
	_, err := s.s0.Run(context.Background(), nil, []tf.Output{r}, nil)
	return err == nil
}

// Variables go round-robin over the ps tasks, a sharded variable taking a
// turn per shard; the placement is real: each ps holds exactly what it was
// given.
func TestVariablesGoRoundRobinOverPS(t *testing.T) {
	s := newInProcess(t, 1, 2)
	var a, b, c, emb strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		if a, err = sc.Variable("a", tf.Float, []int64{2}, strategy.Zeros()); err != nil {
			return err
		}
		if b, err = sc.Variable("b", tf.Float, []int64{2}, strategy.Zeros()); err != nil {
			return err
		}
		if emb, err = sc.Variable("emb", tf.Float, []int64{7, 3}, strategy.Zeros(), strategy.WithPartitioner(FixedShards(3))); err != nil {
			return err
		}
		c, err = sc.Variable("c", tf.Float, []int64{2}, strategy.Zeros())
		return err
	}))
	ps0, ps1 := s.ps[0], s.ps[1]
	assert.Equal(t, []ShardInfo{{ps0, 0, 2}}, psVar(a).Shards())
	assert.Equal(t, []ShardInfo{{ps1, 0, 2}}, psVar(b).Shards())
	assert.Equal(t, []ShardInfo{{ps0, 0, 3}, {ps1, 3, 2}, {ps0, 5, 2}}, psVar(emb).Shards())
	assert.Equal(t, []ShardInfo{{ps1, 0, 2}}, psVar(c).Shards())
	for _, v := range []strategy.Variable{a, b, c, emb} {
		for _, sh := range psVar(v).shards {
			other := ps0
			if sh.device == ps0 {
				other = ps1
			}
			assert.True(t, psHolds(t, s, sh.device, sh.shared, tf.Float), "%s is on %s", sh.viewName(), sh.device)
			assert.False(t, psHolds(t, s, other, sh.shared, tf.Float), "%s is not on %s", sh.viewName(), other)
		}
	}
}

// A sharded variable initialises each shard with its rows of the whole
// initial value, and reads as one tensor on the chief and in a step.
func TestShardedVariableReadsAsOneTensor(t *testing.T) {
	s := newInProcess(t, 2, 2)
	init := [][]float32{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}}
	var v strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		v, err = sc.Variable("v", tf.Float, []int64{5, 2}, strategy.Constant(tensor(t, init)), strategy.WithPartitioner(FixedShards(2)))
		return err
	}))
	require.Equal(t, 2, psVar(v).NumShards())
	ctx := testContext(t, time.Minute)
	got, err := s.Value(ctx, v)
	require.NoError(t, err)
	assert.Equal(t, init, got.Value())

	fn, err := s.Build(strategy.InputSpec{"scale": {DType: tf.Float, Shape: []int64{}}},
		func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"v": op.Mul(rc.Scope().SubScope("mul"), strategy.MustRead(rc, v), in["scale"])}, nil
		})
	require.NoError(t, err)
	c := newCoordinator(t, s)
	var rvs []*RemoteValue
	for range 4 {
		rv, err := c.Schedule(fn, Feed(dataset.Element{"scale": tensor(t, float32(2))}))
		require.NoError(t, err)
		rvs = append(rvs, rv)
	}
	require.NoError(t, c.Join(ctx))
	want := [][]float32{{0, 2}, {4, 6}, {8, 10}, {12, 14}, {16, 18}}
	for _, rv := range rvs {
		out, err := rv.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, out["v"].Value())
		assert.False(t, rv.Info().Applied, "a step without updates applies nothing")
	}
	n, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// Bad variables are errors naming the variable and what was expected.
func TestBadVariables(t *testing.T) {
	s := newInProcess(t, 1, 1)
	err := s.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("emb", tf.Float, []int64{3, 4}, strategy.Zeros(), strategy.WithPartitioner(FixedShards(4)))
		return err
	})
	assert.ErrorContains(t, err, `variable "emb": the partitioner asks for 4 shards of 3 rows`)
	err = s.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("step", tf.Int64, nil, strategy.Zeros(), strategy.WithPartitioner(FixedShards(2)))
		return err
	})
	assert.ErrorContains(t, err, "shards of a scalar")
	err = s.Scope(func(sc strategy.Scope) error {
		if _, err := sc.Variable("x", tf.Float, []int64{2}, strategy.Zeros()); err != nil {
			return err
		}
		_, err := sc.Variable("x", tf.Float, []int64{2}, strategy.Zeros())
		return err
	})
	assert.ErrorContains(t, err, `variable "x": already used`)
	err = s.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("/bad", tf.Float, []int64{2}, strategy.Zeros())
		return err
	})
	assert.ErrorContains(t, err, `variable name "/bad"`)
	var kept strategy.Scope
	require.NoError(t, s.Scope(func(sc strategy.Scope) error { kept = sc; return nil }))
	_, err = kept.Variable("late", tf.Float, []int64{1}, strategy.Zeros())
	assert.True(t, errors.Is(err, strategy.ErrScopeClosed))
}
