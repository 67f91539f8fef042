// Package partitiontest is the Model the tests of partition and its
// transport share: a step as the parameter-server strategy builds one,
// split across a Worker and two ps Tasks, and what one session computes
// for it.
package partitiontest

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

const (
	Worker = "/job:Worker/replica:0/task:0"
	PS0    = "/job:ps/replica:0/task:0"
	PS1    = "/job:ps/replica:0/task:1"
)

var Tasks = []string{Worker, PS0, PS1}

// Model has variables on two ps Tasks, a dense read of two of them and a
// lookup of rows of the third, the loss and gradients on the Worker,
// updates on the ps Tasks, and a step counter that counts only after
// every update.
type Model struct {
	G                  *tf.Graph
	X, IDs             tf.Output
	Loss               tf.Output
	Init, Step         []*tf.Operation
	W, B, Emb, Counter tf.Output // read ops, for the checks
}

func NewModel(t testing.TB) *Model {
	m := &Model{G: tf.NewGraph()}
	s := op.NewScopeWithGraph(m.G)
	dev := func(Name, task string) *op.Scope { return s.SubScope(Name).WithDevice(task + "/device:CPU:0") }
	handle := func(Name, task string, shape ...int64) tf.Output {
		return op.VarHandleOp(dev(Name, task), tf.Float, tf.MakeShape(shape...), op.VarHandleOpSharedName(Name))
	}
	w, b, emb := handle("w", PS0, 4, 3), handle("b", PS1, 3), handle("emb", PS1, 10, 4)
	counter := handle("counter", PS0)
	seed := func(Name string, shape ...int64) tf.Output {
		return op.RandomUniform(s.SubScope(Name), op.Const(s.SubScope(Name+"_shape"), shape), tf.Float, op.RandomUniformSeed(7), op.RandomUniformSeed2(int64(len(Name))))
	}
	m.Init = []*tf.Operation{
		op.AssignVariableOp(s.SubScope("init_w"), w, seed("w0", 4, 3)),
		op.AssignVariableOp(s.SubScope("init_b"), b, seed("b0", 3)),
		op.AssignVariableOp(s.SubScope("init_emb"), emb, seed("emb0", 10, 4)),
		op.AssignVariableOp(s.SubScope("init_counter"), counter, op.Const(s.SubScope("zero"), float32(0))),
	}
	ws := s.SubScope("step").WithDevice(Worker + "/device:CPU:0")
	m.X = op.Placeholder(ws.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, 4)))
	m.IDs = op.Placeholder(ws.SubScope("ids"), tf.Int32, op.PlaceholderShape(tf.MakeShape(-1)))
	rw := op.ReadVariableOp(dev("read_w", PS0), w, tf.Float)
	rb := op.ReadVariableOp(dev("read_b", PS1), b, tf.Float)
	rows := op.ResourceGather(s.SubScope("lookup"), emb, m.IDs, tf.Float) // placed with emb
	y := op.Add(ws.SubScope("y"), op.MatMul(ws.SubScope("mm"), op.Add(ws.SubScope("xe"), m.X, rows), rw), rb)
	m.Loss = op.Sum(ws.SubScope("loss"), op.Square(ws.SubScope("sq"), y), op.Const(ws.SubScope("axes"), []int32{0, 1}))
	grads, err := m.G.AddGradients("grads", []tf.Output{m.Loss}, []tf.Output{rw, rb, rows}, nil)
	require.NoError(t, err)
	lr := op.Const(s.SubScope("lr"), float32(0.01))
	aw := op.ResourceApplyGradientDescent(s.SubScope("apply_w"), w, lr, grads[0])
	ab := op.ResourceApplyGradientDescent(s.SubScope("apply_b"), b, lr, grads[1])
	ae := op.ResourceScatterSub(s.SubScope("apply_emb"), emb, m.IDs, op.Mul(s.SubScope("scaled").WithDevice(PS1+"/device:CPU:0"), grads[2], lr))
	count := op.AssignAddVariableOp(s.SubScope("count").WithControlDependencies(aw, ab, ae), counter, op.Const(s.SubScope("one"), float32(1)))
	m.Step = []*tf.Operation{count}
	rs := s.SubScope("reads")
	m.W = op.ReadVariableOp(rs.SubScope("w"), w, tf.Float)
	m.B = op.ReadVariableOp(rs.SubScope("b"), b, tf.Float)
	m.Emb = op.ReadVariableOp(rs.SubScope("emb"), emb, tf.Float)
	m.Counter = op.ReadVariableOp(rs.SubScope("counter"), counter, tf.Float)
	require.NoError(t, s.Err())
	return m
}

// batch is step i's feeds; an id of 10 or more is out of the embedding's
// range.
func (m *Model) Batch(t testing.TB, i int, ids ...int32) map[string]*tf.Tensor {
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
	return map[string]*tf.Tensor{Name(m.X): xt, Name(m.IDs): it}
}

// Name is o's tensor name, as plans name values.
func Name(o tf.Output) string { return fmt.Sprintf("%s:%d", o.Op.Name(), o.Index) }

// Plan plans spec, with the worker as the default task.
func (m *Model) Plan(t testing.TB, spec partition.Spec) *partition.Plan {
	spec.Default = Worker
	p, err := partition.New(m.G, spec)
	require.NoError(t, err)
	return p
}

// InitPlan initialises the variables.
func (m *Model) InitPlan(t testing.TB) *partition.Plan {
	return m.Plan(t, partition.Spec{Targets: m.Init})
}

// StepPlan runs a step: it feeds X and IDs, fetches Loss and counts.
func (m *Model) StepPlan(t testing.TB) *partition.Plan {
	return m.Plan(t, partition.Spec{Feeds: []tf.Output{m.X, m.IDs}, Fetches: []tf.Output{m.Loss}, Targets: m.Step})
}

// Reads are the reads of every variable.
func (m *Model) Reads() []tf.Output { return []tf.Output{m.W, m.B, m.Emb, m.Counter} }

// ReadPlan fetches Reads.
func (m *Model) ReadPlan(t testing.TB) *partition.Plan {
	return m.Plan(t, partition.Spec{Fetches: m.Reads()})
}

// OneSession runs the Model's graph, devices removed, in one local session:
// what the plans must compute.
type OneSession struct {
	g    *tf.Graph
	sess *tf.Session
}

// NewOneSession imports m's graph without its devices.
func NewOneSession(t testing.TB, m *Model) *OneSession {
	var buf bytes.Buffer
	_, err := m.G.WriteTo(&buf)
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
	return &OneSession{g: g, sess: sess}
}

// Run runs the session; feeds are by tensor name.
func (o *OneSession) Run(t testing.TB, feeds map[string]*tf.Tensor, fetches []tf.Output, targets []*tf.Operation) []*tf.Tensor {
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

// Hosts is a Host per task, in process: Plan.Execute with local runners.
type Hosts struct {
	t     testing.TB
	Hosts map[string]*partition.Host
	n     int
}

// NewHosts starts a host per task of Tasks.
func NewHosts(t testing.TB) *Hosts {
	h := &Hosts{t: t, Hosts: map[string]*partition.Host{}}
	for _, task := range Tasks {
		host, err := partition.NewHost(nil)
		require.NoError(t, err)
		t.Cleanup(func() { host.Close() })
		h.Hosts[task] = host
	}
	return h
}

// Install imports p's fragments under a new prefix and returns their
// runners.
func (h *Hosts) Install(p *partition.Plan) map[string]partition.Runner {
	h.n++
	prefix := fmt.Sprintf("plan_%d", h.n)
	runners := map[string]partition.Runner{}
	for task, frag := range p.Fragments {
		require.NoError(h.t, h.Hosts[task].Import(prefix, frag))
		runners[task] = h.Hosts[task].Runner(prefix)
	}
	return runners
}
