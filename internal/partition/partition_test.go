package partition_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/partition/partitiontest"
)

const (
	worker = partitiontest.Worker
	ps0    = partitiontest.PS0
	ps1    = partitiontest.PS1
)

// TestPlanEqualsOneSession: a step split across a worker and two ps tasks,
// run for a few steps, leaves every variable, element by element, as one
// session running the whole graph does, and fetches the same losses.
func TestPlanEqualsOneSession(t *testing.T) {
	m := partitiontest.NewModel(t)
	ref := partitiontest.NewOneSession(t, m)
	ctx := context.Background()
	p := install(t, m)
	ref.Run(t, nil, nil, m.Init)
	for i := range 6 {
		feeds := m.Batch(t, i)
		got, err := p.step.Execute(ctx, p.stepRun, feeds)
		require.NoError(t, err)
		want := ref.Run(t, feeds, []tf.Output{m.Loss}, m.Step)
		assert.Equal(t, want[0].Value(), got[0].Value(), "loss of step %d", i)
	}
	reads := m.Reads()
	got, err := p.read.Execute(ctx, p.readRun, nil)
	require.NoError(t, err)
	want := ref.Run(t, nil, reads, nil)
	for i := range reads {
		assert.Equal(t, want[i].Value(), got[i].Value(), "variable %s", reads[i].Op.Name())
	}
	assert.Equal(t, float32(6), got[3].Value(), "the counter counts every step")
}

// plans are the model's plans, installed on hosts of their own, and their
// runners.
type plans struct {
	init, step, read          *partition.Plan
	initRun, stepRun, readRun map[string]partition.Runner
}

// install installs m's plans on new hosts and initialises the variables.
func install(t *testing.T, m *partitiontest.Model) plans {
	hosts := partitiontest.NewHosts(t)
	p := plans{init: m.InitPlan(t), step: m.StepPlan(t), read: m.ReadPlan(t)}
	p.initRun, p.stepRun, p.readRun = hosts.Install(p.init), hosts.Install(p.step), hosts.Install(p.read)
	_, err := p.init.Execute(context.Background(), p.initRun, nil)
	require.NoError(t, err)
	return p
}

// TestStepCrossesEachLinkOnce: the step reads on the ps tasks, computes on
// the worker and updates on the ps tasks, in that order, and each value
// that crosses tasks is fetched once.
func TestStepCrossesEachLinkOnce(t *testing.T) {
	p := partitiontest.NewModel(t).StepPlan(t)
	var tasks [][]string
	fetched := map[string]int{}
	for _, round := range p.Rounds {
		var ts []string
		for _, r := range round {
			ts = append(ts, r.Task)
			for _, f := range r.Fetches {
				fetched[f]++
			}
		}
		tasks = append(tasks, ts)
	}
	require.GreaterOrEqual(t, len(tasks), 3, "rounds %v", tasks)
	assert.Equal(t, []string{ps0, ps1}, tasks[0], "rounds %v: the ps tasks read first", tasks)
	assert.Equal(t, []string{worker}, tasks[1], "rounds %v: the worker computes once, after the reads", tasks)
	for _, ts := range tasks[2:] {
		assert.NotContains(t, ts, worker, "rounds %v: the ps tasks update last", tasks)
	}
	for v, n := range fetched {
		assert.Equal(t, 1, n, "value %s fetched %d times", v, n)
	}
	assert.Equal(t, []string{worker, ps0, ps1}, keys(p.Fragments))
}

func keys(m map[string][]byte) []string {
	var out []string
	for _, task := range []string{worker, ps0, ps1} {
		if _, ok := m[task]; ok {
			out = append(out, task)
		}
	}
	return out
}

// TestResourceOnAnotherTask: an op placed on one task that uses a
// variable of another is refused, naming both.
func TestResourceOnAnotherTask(t *testing.T) {
	g := tf.NewGraph()
	s := op.NewScopeWithGraph(g)
	h := op.VarHandleOp(s.SubScope("v").WithDevice(ps0), tf.Float, tf.ScalarShape(), op.VarHandleOpSharedName("v"))
	r := op.ReadVariableOp(s.SubScope("read").WithDevice(ps1), h, tf.Float)
	require.NoError(t, s.Err())
	_, err := partition.New(g, partition.Spec{Fetches: []tf.Output{r}, Default: worker})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `op "read/ReadVariableOp"`)
	assert.Contains(t, err.Error(), ps1)
	assert.Contains(t, err.Error(), ps0)
}

// runnerFunc is a Runner of a function.
type runnerFunc func(ctx context.Context) error

func (f runnerFunc) Run(ctx context.Context, _ map[string]*tf.Tensor, _, _ []string) ([]*tf.Tensor, error) {
	return nil, f(ctx)
}

// TestExecuteNamesTheRunThatFailedFirst: when a run fails, the other runs
// of its round are cancelled; the plan's error names the run that failed,
// not one that ended because it was cancelled, whatever their order.
func TestExecuteNamesTheRunThatFailedFirst(t *testing.T) {
	boom := fmt.Errorf("boom")
	p := &partition.Plan{Rounds: [][]partition.Run{{{Task: ps0}, {Task: ps1}}}}
	runners := map[string]partition.Runner{
		ps0: runnerFunc(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }),
		ps1: runnerFunc(func(context.Context) error { return boom }),
	}
	_, err := p.Execute(context.Background(), runners, nil)
	var re *partition.RunError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, ps1, re.Task)
	assert.ErrorIs(t, err, boom)
}

// A run of an Interruptible host that waits forever (a queue nothing
// fills) ends with its context, and the host runs its fragments after it,
// in a new session over the same graph.
func TestInterruptibleHostEndsAWaitingRun(t *testing.T) {
	g := tf.NewGraph()
	s := op.NewScopeWithGraph(g)
	q := op.FIFOQueueV2(s.SubScope("queue"), []tf.DataType{tf.Int32})
	deq := op.QueueDequeueV2(s.SubScope("dequeue"), q, []tf.DataType{tf.Int32})
	seven := op.Const(s.SubScope("seven"), int32(7))
	require.NoError(t, s.Err())
	stuck, err := partition.New(g, partition.Spec{Fetches: deq, Default: worker})
	require.NoError(t, err)
	fine, err := partition.New(g, partition.Spec{Fetches: []tf.Output{seven}, Default: worker})
	require.NoError(t, err)

	h, err := partition.NewHost(nil, partition.Interruptible())
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	require.NoError(t, h.Import("stuck", stuck.Fragments[worker]))
	require.NoError(t, h.Import("fine", fine.Fragments[worker]))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = stuck.Execute(ctx, map[string]partition.Runner{worker: h.Runner("stuck")}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	out, err := fine.Execute(context.Background(), map[string]partition.Runner{worker: h.Runner("fine")}, nil)
	require.NoError(t, err)
	assert.Equal(t, int32(7), out[0].Value())
}

// corrupting is a worker's runner whose fetched values of shape from come
// back transposed to shape to, as a faulty worker would push them.
type corrupting struct {
	partition.Runner
	t        *testing.T
	from, to []int64
}

func (c corrupting) Run(ctx context.Context, feeds map[string]*tf.Tensor, fetches, targets []string) ([]*tf.Tensor, error) {
	out, err := c.Runner.Run(ctx, feeds, fetches, targets)
	for i, v := range out {
		if fmt.Sprint(v.Shape()) == fmt.Sprint(c.from) {
			out[i], err = tf.NewTensor(zeros(c.to))
			require.NoError(c.t, err)
		}
	}
	return out, err
}

func zeros(shape []int64) [][]float32 {
	z := make([][]float32, shape[0])
	for i := range z {
		z[i] = make([]float32, shape[1])
	}
	return z
}

// A value of the wrong shape fed to a ps task (a gradient of w, transposed
// by a faulty worker) is refused before the run starts, naming the value,
// both shapes and the variable it updates; w does not change, the step
// does not count, and the next step runs.
func TestWrongShapeIsRefusedBeforeTheRun(t *testing.T) {
	m := partitiontest.NewModel(t)
	ctx := context.Background()
	p := install(t, m)
	before, err := p.read.Execute(ctx, p.readRun, nil)
	require.NoError(t, err)

	bad := maps.Clone(p.stepRun)
	bad[worker] = corrupting{Runner: p.stepRun[worker], t: t, from: []int64{4, 3}, to: []int64{3, 4}}
	_, err = p.step.Execute(ctx, bad, m.Batch(t, 0))
	var re *partition.RunError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, ps0, re.Task)
	var fe *partition.FeedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, []string{"w"}, fe.Variables)
	assert.Equal(t, "float32 [3 4]", fe.Got)
	assert.Equal(t, "float32 [4 3]", fe.Want)
	assert.ErrorContains(t, err, "it updates variable [w], left untouched")

	after, err := p.read.Execute(ctx, p.readRun, nil)
	require.NoError(t, err)
	assert.Equal(t, before[0].Value(), after[0].Value(), "w is untouched")
	assert.Equal(t, float32(0), after[3].Value(), "the step did not count")
	_, err = p.step.Execute(ctx, p.stepRun, m.Batch(t, 0))
	require.NoError(t, err)
}

// A value that a Switch may leave dead crosses tasks: dead, the update it
// feeds on the other task does not run; live, it does, as in one session.
func TestMaybeDeadValueCrossesTasks(t *testing.T) {
	g := tf.NewGraph()
	s := op.NewScopeWithGraph(g)
	on := func(name, task string) *op.Scope { return s.SubScope(name).WithDevice(task + "/device:CPU:0") }
	thr := op.Placeholder(on("threshold", worker), tf.Float, op.PlaceholderShape(tf.ScalarShape()))
	x := op.Const(on("x", ps0), float32(3))
	taken := op.Less(on("taken", ps0), thr, x)
	_, branch := op.Switch(on("switch", ps0), x, taken)
	sq := op.Square(on("square", ps0), branch)
	v := op.VarHandleOp(on("v", ps1), tf.Float, tf.ScalarShape(), op.VarHandleOpSharedName("v"))
	initV := op.AssignVariableOp(on("init", ps1), v, op.Const(on("zero", ps1), float32(0)))
	add := op.AssignAddVariableOp(on("add", ps1), v, sq)
	read := op.ReadVariableOp(on("read", ps1), v, tf.Float)
	require.NoError(t, s.Err())

	hosts := partitiontest.NewHosts(t)
	ctx := context.Background()
	plan := func(spec partition.Spec) (*partition.Plan, map[string]partition.Runner) {
		spec.Default = worker
		p, err := partition.New(g, spec)
		require.NoError(t, err)
		return p, hosts.Install(p)
	}
	initP, initR := plan(partition.Spec{Targets: []*tf.Operation{initV}})
	stepP, stepR := plan(partition.Spec{Feeds: []tf.Output{thr}, Targets: []*tf.Operation{add}})
	readP, readR := plan(partition.Spec{Fetches: []tf.Output{read}})
	_, err := initP.Execute(ctx, initR, nil)
	require.NoError(t, err)
	want := float32(0)
	for _, threshold := range []float32{5, 1, 4, 2} {
		thrT, err := tf.NewTensor(threshold)
		require.NoError(t, err)
		_, err = stepP.Execute(ctx, stepR, map[string]*tf.Tensor{partitiontest.Name(thr): thrT})
		require.NoError(t, err, "threshold %v", threshold)
		if threshold < 3 {
			want += 9
		}
		got, err := readP.Execute(ctx, readR, nil)
		require.NoError(t, err)
		assert.Equal(t, want, got[0].Value(), "after threshold %v", threshold)
	}
}
