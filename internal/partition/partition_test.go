package partition_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/partition"
)

const (
	worker = "/job:worker/replica:0/task:0"
	ps0    = "/job:ps/replica:0/task:0"
	ps1    = "/job:ps/replica:0/task:1"
)

// model is a step as the parameter-server strategy builds one: variables
// on two ps tasks, a dense read of two of them and a lookup of rows of the
// third, the loss and gradients on the worker, updates on the ps tasks,
// and a step counter that counts only after every update.
type model struct {
	g                  *tf.Graph
	x, ids             tf.Output
	loss               tf.Output
	init, step         []*tf.Operation
	w, b, emb, counter tf.Output // read ops, for the checks
}

func newModel(t *testing.T) *model {
	m := &model{g: tf.NewGraph()}
	s := op.NewScopeWithGraph(m.g)
	dev := func(name, task string) *op.Scope { return s.SubScope(name).WithDevice(task + "/device:CPU:0") }
	handle := func(name, task string, shape ...int64) tf.Output {
		return op.VarHandleOp(dev(name, task), tf.Float, tf.MakeShape(shape...), op.VarHandleOpSharedName(name))
	}
	w, b, emb := handle("w", ps0, 4, 3), handle("b", ps1, 3), handle("emb", ps1, 10, 4)
	counter := handle("counter", ps0)
	seed := func(name string, shape ...int64) tf.Output {
		return op.RandomUniform(s.SubScope(name), op.Const(s.SubScope(name+"_shape"), shape), tf.Float, op.RandomUniformSeed(7), op.RandomUniformSeed2(int64(len(name))))
	}
	m.init = []*tf.Operation{
		op.AssignVariableOp(s.SubScope("init_w"), w, seed("w0", 4, 3)),
		op.AssignVariableOp(s.SubScope("init_b"), b, seed("b0", 3)),
		op.AssignVariableOp(s.SubScope("init_emb"), emb, seed("emb0", 10, 4)),
		op.AssignVariableOp(s.SubScope("init_counter"), counter, op.Const(s.SubScope("zero"), float32(0))),
	}
	ws := s.SubScope("step").WithDevice(worker + "/device:CPU:0")
	m.x = op.Placeholder(ws.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, 4)))
	m.ids = op.Placeholder(ws.SubScope("ids"), tf.Int32, op.PlaceholderShape(tf.MakeShape(-1)))
	rw := op.ReadVariableOp(dev("read_w", ps0), w, tf.Float)
	rb := op.ReadVariableOp(dev("read_b", ps1), b, tf.Float)
	rows := op.ResourceGather(s.SubScope("lookup"), emb, m.ids, tf.Float) // placed with emb
	y := op.Add(ws.SubScope("y"), op.MatMul(ws.SubScope("mm"), op.Add(ws.SubScope("xe"), m.x, rows), rw), rb)
	m.loss = op.Sum(ws.SubScope("loss"), op.Square(ws.SubScope("sq"), y), op.Const(ws.SubScope("axes"), []int32{0, 1}))
	grads, err := m.g.AddGradients("grads", []tf.Output{m.loss}, []tf.Output{rw, rb, rows}, nil)
	require.NoError(t, err)
	lr := op.Const(s.SubScope("lr"), float32(0.01))
	aw := op.ResourceApplyGradientDescent(s.SubScope("apply_w"), w, lr, grads[0])
	ab := op.ResourceApplyGradientDescent(s.SubScope("apply_b"), b, lr, grads[1])
	ae := op.ResourceScatterSub(s.SubScope("apply_emb"), emb, m.ids, op.Mul(s.SubScope("scaled").WithDevice(ps1+"/device:CPU:0"), grads[2], lr))
	count := op.AssignAddVariableOp(s.SubScope("count").WithControlDependencies(aw, ab, ae), counter, op.Const(s.SubScope("one"), float32(1)))
	m.step = []*tf.Operation{count}
	require.NoError(t, s.Err())
	rs := s.SubScope("reads")
	m.w = op.ReadVariableOp(rs.SubScope("w"), w, tf.Float)
	m.b = op.ReadVariableOp(rs.SubScope("b"), b, tf.Float)
	m.emb = op.ReadVariableOp(rs.SubScope("emb"), emb, tf.Float)
	m.counter = op.ReadVariableOp(rs.SubScope("counter"), counter, tf.Float)
	require.NoError(t, s.Err())
	return m
}

func (m *model) batch(t *testing.T, i int) map[string]*tf.Tensor {
	x := make([][]float32, 5)
	ids := make([]int32, 5)
	for r := range x {
		x[r] = []float32{float32(i+r) * 0.1, -0.2, 0.3, float32(r) * -0.05}
		ids[r] = int32((i*3 + r) % 10)
	}
	xt, err := tf.NewTensor(x)
	require.NoError(t, err)
	it, err := tf.NewTensor(ids)
	require.NoError(t, err)
	return map[string]*tf.Tensor{name(m.x): xt, name(m.ids): it}
}

func name(o tf.Output) string { return fmt.Sprintf("%s:%d", o.Op.Name(), o.Index) }

// oneSession runs the model's graph, devices removed, in one local session:
// what the plans must compute.
type oneSession struct {
	g    *tf.Graph
	sess *tf.Session
}

func newOneSession(t *testing.T, m *model) *oneSession {
	var buf bytes.Buffer
	_, err := m.g.WriteTo(&buf)
	require.NoError(t, err)
	g := tf.NewGraph()
	require.NoError(t, g.ImportWithOptions(stripDevices(t, buf.Bytes()), tf.GraphImportOptions{}))
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	return &oneSession{g: g, sess: sess}
}

func (o *oneSession) run(t *testing.T, feeds map[string]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) []*tf.Tensor {
	fm := map[tf.Output]*tf.Tensor{}
	for n, v := range feeds {
		fm[o.output(n)] = v
	}
	var fo []tf.Output
	for _, f := range fetches {
		fo = append(fo, o.output(name(f)))
	}
	var to []*tf.Operation
	for _, op := range targets {
		to = append(to, o.g.Operation(op.Name()))
	}
	out, err := o.sess.Run(fm, fo, to)
	require.NoError(t, err)
	return out
}

func (o *oneSession) output(n string) tf.Output {
	var op string
	var k int
	_, err := fmt.Sscanf(n[len(n)-2:], ":%d", &k)
	if err != nil {
		panic(n)
	}
	op = n[:len(n)-2]
	return o.g.Operation(op).Output(k)
}

// cluster is one Host per task, and the plans imported into them.
type cluster struct {
	t     *testing.T
	hosts map[string]*partition.Host
	n     int
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, hosts: map[string]*partition.Host{}}
	for _, task := range []string{worker, ps0, ps1} {
		h, err := partition.NewHost(nil)
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		c.hosts[task] = h
	}
	return c
}

func (c *cluster) install(p *partition.Plan) map[string]partition.Runner {
	c.n++
	prefix := fmt.Sprintf("plan_%d", c.n)
	runners := map[string]partition.Runner{}
	for task, frag := range p.Fragments {
		require.NoError(c.t, c.hosts[task].Import(prefix, frag))
		runners[task] = c.hosts[task].Runner(prefix)
	}
	return runners
}

func plan(t *testing.T, m *model, spec partition.Spec) *partition.Plan {
	spec.Default = worker
	p, err := partition.New(m.g, spec)
	require.NoError(t, err)
	return p
}

// TestPlanEqualsOneSession: a step split across a worker and two ps tasks,
// run for a few steps, leaves every variable, element by element, as one
// session running the whole graph does, and fetches the same losses.
func TestPlanEqualsOneSession(t *testing.T) {
	m := newModel(t)
	ref := newOneSession(t, m)
	c := newCluster(t)
	ctx := context.Background()

	initPlan := plan(t, m, partition.Spec{Targets: m.init})
	stepPlan := plan(t, m, partition.Spec{Feeds: []tf.Output{m.x, m.ids}, Fetches: []tf.Output{m.loss}, Targets: m.step})
	reads := []tf.Output{m.w, m.b, m.emb, m.counter}
	readPlan := plan(t, m, partition.Spec{Fetches: reads})
	initRun, stepRun, readRun := c.install(initPlan), c.install(stepPlan), c.install(readPlan)

	_, err := initPlan.Execute(ctx, initRun, nil)
	require.NoError(t, err)
	ref.run(t, nil, nil, m.init)
	for i := range 6 {
		feeds := m.batch(t, i)
		got, err := stepPlan.Execute(ctx, stepRun, feeds)
		require.NoError(t, err)
		want := ref.run(t, feeds, []tf.Output{m.loss}, m.step)
		assert.Equal(t, want[0].Value(), got[0].Value(), "loss of step %d", i)
	}
	got, err := readPlan.Execute(ctx, readRun, nil)
	require.NoError(t, err)
	want := ref.run(t, nil, reads, nil)
	for i := range reads {
		assert.Equal(t, want[i].Value(), got[i].Value(), "variable %s", reads[i].Op.Name())
	}
	assert.Equal(t, float32(6), got[3].Value(), "the counter counts every step")
}

// TestStepCrossesEachLinkOnce: the step reads on the ps tasks, computes on
// the worker and updates on the ps tasks, in that order, and each value
// that crosses tasks is fetched once.
func TestStepCrossesEachLinkOnce(t *testing.T) {
	m := newModel(t)
	p := plan(t, m, partition.Spec{Feeds: []tf.Output{m.x, m.ids}, Fetches: []tf.Output{m.loss}, Targets: m.step})
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
