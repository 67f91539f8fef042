package taskserver_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	"github.com/wamuir/graft/tensorflow/op"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/internal/partition"
)

// The model of internal/partition's tests: a step as the parameter-server
// strategy builds one.

const (
	worker = "/job:worker/replica:0/task:0"
	ps0    = "/job:ps/replica:0/task:0"
	ps1    = "/job:ps/replica:0/task:1"
)

var tasks = []string{worker, ps0, ps1}

// model has variables on two ps tasks, a dense read of two of them and a
// lookup of rows of the third, the loss and gradients on the worker,
// updates on the ps tasks, and a step counter that counts only after
// every update.
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
	rs := s.SubScope("reads")
	m.w = op.ReadVariableOp(rs.SubScope("w"), w, tf.Float)
	m.b = op.ReadVariableOp(rs.SubScope("b"), b, tf.Float)
	m.emb = op.ReadVariableOp(rs.SubScope("emb"), emb, tf.Float)
	m.counter = op.ReadVariableOp(rs.SubScope("counter"), counter, tf.Float)
	require.NoError(t, s.Err())
	return m
}

// batch is step i's feeds; an id of 10 or more is out of the embedding's
// range.
func (m *model) batch(t *testing.T, i int, ids ...int32) map[string]*tf.Tensor {
	x := make([][]float32, 5)
	if ids == nil {
		ids = make([]int32, 5)
		for r := range ids {
			ids[r] = int32((i*3 + r) % 10)
		}
	}
	for r := range x {
		x[r] = []float32{float32(i+r) * 0.1, -0.2, 0.3, float32(r) * -0.05}
	}
	xt, err := tf.NewTensor(x)
	require.NoError(t, err)
	it, err := tf.NewTensor(ids)
	require.NoError(t, err)
	return map[string]*tf.Tensor{name(m.x): xt, name(m.ids): it}
}

func name(o tf.Output) string { return fmt.Sprintf("%s:%d", o.Op.Name(), o.Index) }

func (m *model) plan(t *testing.T, spec partition.Spec) *partition.Plan {
	spec.Default = worker
	p, err := partition.New(m.g, spec)
	require.NoError(t, err)
	return p
}

func (m *model) initPlan(t *testing.T) *partition.Plan {
	return m.plan(t, partition.Spec{Targets: m.init})
}

func (m *model) stepPlan(t *testing.T) *partition.Plan {
	return m.plan(t, partition.Spec{Feeds: []tf.Output{m.x, m.ids}, Fetches: []tf.Output{m.loss}, Targets: m.step})
}

func (m *model) reads() []tf.Output { return []tf.Output{m.w, m.b, m.emb, m.counter} }

func (m *model) readPlan(t *testing.T) *partition.Plan {
	return m.plan(t, partition.Spec{Fetches: m.reads()})
}

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
	def := &graphpb.GraphDef{}
	require.NoError(t, proto.Unmarshal(buf.Bytes(), def))
	for _, n := range def.Node {
		n.Device = ""
		delete(n.Attr, "_class")
	}
	b, err := proto.Marshal(def)
	require.NoError(t, err)
	g := tf.NewGraph()
	require.NoError(t, g.ImportWithOptions(b, tf.GraphImportOptions{}))
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	return &oneSession{g: g, sess: sess}
}

func (o *oneSession) run(t *testing.T, feeds map[string]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) []*tf.Tensor {
	fm := map[tf.Output]*tf.Tensor{}
	for n, v := range feeds {
		var op string
		var k int
		_, err := fmt.Sscanf(n[len(n)-2:], ":%d", &k)
		require.NoError(t, err)
		op = n[:len(n)-2]
		fm[o.g.Operation(op).Output(k)] = v
	}
	var fo []tf.Output
	for _, f := range fetches {
		fo = append(fo, o.g.Operation(f.Op.Name()).Output(f.Index))
	}
	var to []*tf.Operation
	for _, op := range targets {
		to = append(to, o.g.Operation(op.Name()))
	}
	out, err := o.sess.Run(fm, fo, to)
	require.NoError(t, err)
	return out
}
