package taskserver_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/partition/partitiontest"
	"github.com/tfdist/tfdist/internal/taskserver"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// TestPlanThroughServersEqualsOneSession: a plan executed by the worker's
// server, which runs the ps tasks' fragments on their servers, fetches
// the same losses step by step, and leaves every variable, element by
// element, as Plan.Execute with local runners and as one session running
// the whole graph do; in plaintext and under mutual TLS.
func TestPlanThroughServersEqualsOneSession(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "tls"}[secure], func(t *testing.T) {
			var opts func(string) []taskserver.Option
			if secure {
				cfgs := tlsConfigs(t, "job-a")
				opts = func(task string) []taskserver.Option {
					return []taskserver.Option{taskserver.WithTLS(cfgs[task]), taskserver.WithJob("00c0ffee")}
				}
			}
			m := partitiontest.NewModel(t)
			ref, local, s := partitiontest.NewOneSession(t, m), partitiontest.NewHosts(t), newServers(t, opts)
			ctx := context.Background()
			initP, stepP, readP := m.InitPlan(t), m.StepPlan(t), m.ReadPlan(t)
			initID, stepID, readID := s.install(initP), s.install(stepP), s.install(readP)
			initL, stepL, readL := local.Install(initP), local.Install(stepP), local.Install(readP)

			s.run(initID, nil)
			_, err := initP.Execute(ctx, initL, nil)
			require.NoError(t, err)
			ref.Run(t, nil, nil, m.Init)
			for i := range 6 {
				feeds := m.Batch(t, i)
				got := s.run(stepID, feeds)
				loc, err := stepP.Execute(ctx, stepL, feeds)
				require.NoError(t, err)
				want := ref.Run(t, feeds, []tf.Output{m.Loss}, m.Step)
				require.Len(t, got, 1)
				assert.Equal(t, want[0].Value(), got[0].Value(), "loss of step %d, against one session", i)
				assert.Equal(t, loc[0].Value(), got[0].Value(), "loss of step %d, against local runners", i)
			}
			got := s.run(readID, nil)
			loc, err := readP.Execute(ctx, readL, nil)
			require.NoError(t, err)
			want := ref.Run(t, nil, m.Reads(), nil)
			for i, r := range m.Reads() {
				assert.Equal(t, want[i].Value(), got[i].Value(), "variable %s, against one session", r.Op.Name())
				assert.Equal(t, loc[i].Value(), got[i].Value(), "variable %s, against local runners", r.Op.Name())
			}
			assert.Equal(t, float32(6), got[3].Value(), "the counter counts every step")
		})
	}
}

// echo is a fragment that returns what it is fed: for each dtype a
// placeholder "<dtype>" and its identity "<dtype>_out", and a variable's
// handle "v".
func echo(t *testing.T) []byte {
	g := tf.NewGraph()
	s := op.NewScopeWithGraph(g)
	for _, dt := range echoed {
		op.Identity(s.SubScope(dtName(dt)+"_out"), op.Placeholder(s.SubScope(dtName(dt)), dt))
	}
	op.VarHandleOp(s.SubScope("v"), tf.Float, tf.ScalarShape())
	require.NoError(t, s.Err())
	var buf bytes.Buffer
	_, err := g.WriteTo(&buf)
	require.NoError(t, err)
	return buf.Bytes()
}

var echoed = []tf.DataType{tf.Float, tf.Double, tf.Int32, tf.Int64, tf.Bool, tf.String, tf.Half}

func dtName(dt tf.DataType) string {
	return map[tf.DataType]string{tf.Float: "float", tf.Double: "double", tf.Int32: "int32", tf.Int64: "int64",
		tf.Bool: "bool", tf.String: "string", tf.Half: "half"}[dt]
}

// in and out are the echo's placeholder and output of dt.
func in(dt tf.DataType) string  { return dtName(dt) + "/Placeholder:0" }
func out(dt tf.DataType) string { return dtName(dt) + "_out/Identity:0" }

func tensor(t *testing.T, v any) *tf.Tensor {
	x, err := tf.NewTensor(v)
	require.NoError(t, err)
	return x
}

// half returns v cast to half by TensorFlow: graft makes no half tensor.
func half(t *testing.T, v any) *tf.Tensor {
	s := op.NewScope()
	c := op.Cast(s, op.Const(s, v), tf.Half)
	g, err := s.Finalize()
	require.NoError(t, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, []tf.Output{c}, nil)
	require.NoError(t, err)
	return out[0]
}

func emptyOf(t *testing.T, dt tf.DataType, shape ...int64) *tf.Tensor {
	x, err := tf.ReadTensor(dt, shape, bytes.NewReader(nil))
	require.NoError(t, err)
	return x
}

// contents returns t's dtype, shape and contents, to compare tensors by.
func contents(t *testing.T, x *tf.Tensor) []any {
	if x.DataType() == tf.String {
		return []any{x.DataType(), x.Shape(), x.Value()}
	}
	var buf bytes.Buffer
	_, err := x.WriteContentsTo(&buf)
	require.NoError(t, err)
	return []any{x.DataType(), x.Shape(), buf.Bytes()}
}

// TestTensorsRoundTrip: a tensor fed to a server's fragment and fetched
// back has its dtype, shape and contents, whatever its dtype (strings of
// any bytes and half included) and shape (scalars and empty tensors
// included); a handle, which means something only on its own task, is
// refused, naming the tensor and its dtype.
func TestTensorsRoundTrip(t *testing.T) {
	n := start(t, "127.0.0.1:0")
	c := client(t, n.addr)
	ctx := context.Background()
	require.NoError(t, c.Import(ctx, "echo", echo(t)))
	r := c.Runner("echo")
	cases := []*tf.Tensor{
		tensor(t, float32(1.5)), tensor(t, [][]float32{{1, -2, 3}, {4, 5, 6e-30}}), emptyOf(t, tf.Float, 0, 3),
		tensor(t, [][]float32{{}, {}}), tensor(t, []float64{1e300, -0.25}), tensor(t, float64(3)),
		tensor(t, [][]int32{{1, 2}, {-3, 2147483647}}), tensor(t, int32(-7)), tensor(t, []int32{}),
		tensor(t, int64(-1<<62)), tensor(t, [][][]int64{{{1}, {2}}}), tensor(t, []bool{true, false, true}), tensor(t, false),
		tensor(t, "a scalar"), tensor(t, [][]string{{"", "\x00\xff binary"}, {"ünïcode", "x"}}), tensor(t, []string{}),
		tensor(t, [0][3]string{}), tensor(t, [3][0][2]string{}), tensor(t, [][]string{{}, {}}),
		half(t, [][]float32{{1, -2.5}, {65504, 0.000061035156}}), half(t, float32(0.5)), half(t, []float32{}),
	}
	for _, x := range cases {
		dt := x.DataType()
		got, err := r.Run(ctx, map[string]*tf.Tensor{in(dt): x}, []string{out(dt)}, nil)
		require.NoError(t, err, "%s %v", dtName(dt), x.Shape())
		require.Len(t, got, 1)
		assert.Equal(t, contents(t, x), contents(t, got[0]), "%s %v", dtName(dt), x.Shape())
	}
	_, err := r.Run(ctx, nil, []string{"v/VarHandleOp:0"}, nil)
	require.Error(t, err)
	assert.ErrorContains(t, err, `tensor "v/VarHandleOp:0": dtype resource cannot cross tasks`)
}

// TestTensorFlowErrorsKeepTheirCode: a run that TensorFlow fails (here,
// a placeholder not fed) fails on the client with the *tfrt.Error,
// code and message, that the run on a local Host fails with.
func TestTensorFlowErrorsKeepTheirCode(t *testing.T) {
	n := start(t, "127.0.0.1:0")
	c := client(t, n.addr)
	ctx := context.Background()
	require.NoError(t, c.Import(ctx, "echo", echo(t)))
	host, err := partition.NewHost(nil)
	require.NoError(t, err)
	defer host.Close()
	require.NoError(t, host.Import("echo", echo(t)))
	var feeds map[string]*tf.Tensor // the placeholder is not fed

	_, remote := c.Runner("echo").Run(ctx, feeds, []string{out(tf.Float)}, nil)
	var te *tfrt.Error
	require.ErrorAs(t, remote, &te)
	assert.ErrorContains(t, remote, n.addr)
	_, err = host.Runner("echo").Run(ctx, feeds, []string{out(tf.Float)}, nil)
	var local *tfrt.Error
	require.ErrorAs(t, err, &local)
	assert.Equal(t, local, te)
}

// TestFailuresOfPSTasksNameThem: the error of a step that fails on a ps
// task names the task, whether TensorFlow failed the run there (a lookup
// of a row out of range, with its code), the task stopped
// (ErrUnavailable) or it restarted (ErrRestarted), so that the chief
// tells a ps task's failure from the worker's.
func TestFailuresOfPSTasksNameThem(t *testing.T) {
	m := partitiontest.NewModel(t)
	s := newServers(t, nil)
	ctx := context.Background()
	initP, stepP := m.InitPlan(t), m.StepPlan(t)
	initID, stepID := s.install(initP), s.install(stepP)
	s.run(initID, nil)
	s.run(stepID, m.Batch(t, 0))
	runError := func(err error) *partition.RunError {
		t.Helper()
		var re *partition.RunError
		require.ErrorAs(t, err, &re)
		return re
	}

	bad := m.Batch(t, 1, 1, 2, 99, 3, 4)
	_, err := s.clients[partitiontest.Worker].RunPlan(ctx, stepID, bad)
	assert.Equal(t, partitiontest.PS1, runError(err).Task, "%v", err)
	var te *tfrt.Error
	require.ErrorAs(t, err, &te)
	assert.Contains(t, te.Msg, "99 is not in [0, 10)")
	local := partitiontest.NewHosts(t)
	initL, stepL := local.Install(initP), local.Install(stepP)
	_, err = initP.Execute(ctx, initL, nil)
	require.NoError(t, err)
	_, err = stepP.Execute(ctx, stepL, bad)
	var lte *tfrt.Error
	require.ErrorAs(t, err, &lte)
	assert.Equal(t, lte.Code, te.Code, "the code of the run on a local host")

	addr := s.nodes[partitiontest.PS0].addr
	s.nodes[partitiontest.PS0].stop(t)
	_, err = s.clients[partitiontest.Worker].RunPlan(ctx, stepID, m.Batch(t, 2))
	assert.Equal(t, partitiontest.PS0, runError(err).Task, "%v", err)
	assert.ErrorIs(t, err, taskserver.ErrUnavailable)
	assert.ErrorContains(t, err, addr)

	start(t, addr)
	_, err = s.clients[partitiontest.Worker].RunPlan(ctx, stepID, m.Batch(t, 3))
	assert.Equal(t, partitiontest.PS0, runError(err).Task, "%v", err)
	assert.ErrorIs(t, err, taskserver.ErrRestarted)
	_, err = s.clients[partitiontest.Worker].RunPlan(ctx, stepID, m.Batch(t, 4))
	assert.Equal(t, partitiontest.PS0, runError(err).Task, "%v", err)
	assert.ErrorIs(t, err, taskserver.ErrUnknown, "the new ps task has no fragment of the plan")
}

// TestUnknownPrefixOrPlan: a run of a fragment never imported, or of a
// plan never installed, fails with ErrUnknown, naming it.
func TestUnknownPrefixOrPlan(t *testing.T) {
	n := start(t, "127.0.0.1:0")
	c := client(t, n.addr)
	ctx := context.Background()
	_, err := c.Runner("nothing").Run(ctx, nil, []string{"x:0"}, nil)
	assert.ErrorIs(t, err, taskserver.ErrUnknown)
	assert.ErrorContains(t, err, `"nothing"`)
	_, err = c.RunPlan(ctx, "no plan", nil)
	assert.ErrorIs(t, err, taskserver.ErrUnknown)
	assert.ErrorContains(t, err, `"no plan"`)
	assert.False(t, errors.Is(err, taskserver.ErrUnavailable))
}

// A value of the wrong shape sent to a ps task's fragment is refused with
// the value, both shapes and the variable it updates; the audit log names
// the peer that sent it; the task serves the fragment's next run. A run of
// an op or a fragment the task does not hold is refused with its name.
func TestWrongValuesAndNamesAreRefused(t *testing.T) {
	log, logs := auditLog()
	n := start(t, "127.0.0.1:0", taskserver.WithLogger(log))
	c := client(t, n.addr)
	ctx := context.Background()
	m := partitiontest.NewModel(t)
	init, step := m.InitPlan(t), m.StepPlan(t)
	require.NoError(t, c.Import(ctx, "init", init.Fragments[partitiontest.PS0]))
	require.NoError(t, c.Import(ctx, "step", step.Fragments[partitiontest.PS0]))
	var targets []string
	for _, round := range init.Rounds {
		for _, r := range round {
			if r.Task == partitiontest.PS0 {
				targets = append(targets, r.Targets...)
			}
		}
	}
	_, err := c.Runner("init").Run(ctx, nil, nil, targets)
	require.NoError(t, err)

	bad := tensor(t, [][][]float32{{{1}}})
	var refused []string
	for _, round := range step.Rounds {
		for _, r := range round {
			if r.Task != partitiontest.PS0 {
				continue
			}
			for _, f := range r.Feeds {
				_, err := c.Runner("step").Run(ctx, map[string]*tf.Tensor{f.Tensor: bad}, nil, r.Targets)
				require.ErrorContains(t, err, "fed float32 [1 1 1], expected ")
				assert.ErrorContains(t, err, f.Tensor)
				if strings.Contains(err.Error(), "it updates variable [w], left untouched") {
					refused = append(refused, f.Tensor)
				}
			}
		}
	}
	require.Len(t, refused, 1, "one value updates w")
	records := logs.FilterLoggerName("audit").FilterMessage("value refused").All()
	require.NotEmpty(t, records)
	var named bool
	for _, r := range records {
		fields := r.ContextMap()
		assert.Contains(t, fields, "address", "the record names the peer")
		named = named || strings.Contains(fields["reason"].(string), refused[0])
	}
	assert.True(t, named, "a record names the value that updates w")

	_, err = c.Runner("step").Run(ctx, nil, []string{"no_such_op:0"}, nil)
	assert.ErrorContains(t, err, `fragment "step" has no op "no_such_op"`)
	_, err = c.Runner("init").Run(ctx, nil, nil, targets)
	assert.NoError(t, err, "the task goes on")
}

// TestRestartedServerIsReported: a client that reaches a new server at
// the address of the one it talked to fails that call with ErrRestarted,
// unrun; the next call reaches the new server, which has lost the
// fragment.
func TestRestartedServerIsReported(t *testing.T) {
	first := start(t, "127.0.0.1:0")
	c := client(t, first.addr)
	ctx := context.Background()
	inc, err := c.Ping(ctx)
	require.NoError(t, err)
	assert.Equal(t, first.srv.Incarnation(), inc)
	require.NoError(t, c.Import(ctx, "echo", echo(t)))
	run := func() error {
		_, err := c.Runner("echo").Run(ctx, map[string]*tf.Tensor{in(tf.Int32): tensor(t, int32(1))}, []string{out(tf.Int32)}, nil)
		return err
	}
	require.NoError(t, run())

	first.stop(t)
	second := start(t, first.addr)
	assert.NotEqual(t, inc, second.srv.Incarnation())
	err = run()
	assert.ErrorIs(t, err, taskserver.ErrRestarted)
	assert.ErrorContains(t, err, first.addr)
	assert.ErrorIs(t, run(), taskserver.ErrUnknown)
	inc, err = c.Ping(ctx)
	require.NoError(t, err)
	assert.Equal(t, second.srv.Incarnation(), inc)
}

// TestStoppedServerIsUnavailable: a call to a stopped server fails at
// once with ErrUnavailable, naming the address; one to a server that
// never answers fails so at the client's timeout, or the context's
// deadline.
func TestStoppedServerIsUnavailable(t *testing.T) {
	n := start(t, "127.0.0.1:0")
	c := client(t, n.addr, taskserver.WithTimeout(5*time.Second))
	ctx := context.Background()
	_, err := c.Ping(ctx)
	require.NoError(t, err)
	n.stop(t)
	begin := time.Now()
	_, err = c.Ping(ctx)
	assert.ErrorIs(t, err, taskserver.ErrUnavailable)
	assert.ErrorContains(t, err, n.addr)
	assert.Less(t, time.Since(begin), 5*time.Second)

	mute := listenMute(t)
	const bound = 300 * time.Millisecond
	c = client(t, mute, taskserver.WithTimeout(bound))
	begin = time.Now()
	_, err = c.Ping(ctx)
	assert.ErrorIs(t, err, taskserver.ErrUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(begin), bound)
	assert.Less(t, time.Since(begin), bound+5*time.Second)

	c = client(t, mute)
	dctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	begin = time.Now()
	_, err = c.RunPlan(dctx, "p", nil)
	assert.ErrorIs(t, err, taskserver.ErrUnavailable)
	assert.Less(t, time.Since(begin), bound+5*time.Second)
}

// listenMute returns the address of a listener that accepts connections
// and never answers.
func listenMute(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// TestConnectionsAreReused: thousands of calls, direct and through the
// worker's server, leave the process with as many file descriptors as
// before: connections are kept and reused.
func TestConnectionsAreReused(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd")
	}
	m := partitiontest.NewModel(t)
	s := newServers(t, nil)
	ctx := context.Background()
	readP := m.ReadPlan(t)
	initID, readID := s.install(m.InitPlan(t)), s.install(readP)
	s.run(initID, nil)
	var direct partition.Run
	for _, r := range readP.Rounds[0] {
		if r.Task == partitiontest.PS0 {
			direct = r
		}
	}
	require.Equal(t, partitiontest.PS0, direct.Task)
	runner := s.clients[partitiontest.PS0].Runner(readID)
	step := func() {
		s.run(readID, nil)
		_, err := runner.Run(ctx, nil, direct.Fetches, direct.Targets)
		require.NoError(t, err)
	}
	step()
	before := fds(t)
	for range 2000 {
		step()
	}
	assert.InDelta(t, before, fds(t), 6, "file descriptors before and after 2000 calls")
}

func fds(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(es)
}

// TestAnotherJobIsRefused: a request of another job, or of another
// protocol version, is refused with the reason, which the audit log
// records; a request of the job is served.
func TestAnotherJobIsRefused(t *testing.T) {
	log, logs := auditLog()
	n := start(t, "127.0.0.1:0", taskserver.WithJob("aaaa"), taskserver.WithLogger(log))
	ctx := context.Background()
	_, err := client(t, n.addr, taskserver.WithJob("bbbb")).Ping(ctx)
	var re *taskserver.RefusedError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, n.addr, re.Addr)
	assert.Contains(t, re.Reason, `job "bbbb"; this server serves job "aaaa"`)
	refused := logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	require.Len(t, refused, 1)
	assert.Equal(t, re.Reason, refused[0].ContextMap()["reason"])
	assert.Equal(t, "bbbb", refused[0].ContextMap()["job_claimed"])

	_, err = client(t, n.addr, taskserver.WithJob("aaaa")).Ping(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, logs.FilterLoggerName("audit").FilterMessage("peer joined").Len())

	req, err := http.NewRequest(http.MethodPost, "http://"+n.addr+"/tfdist/v1/ping", nil)
	require.NoError(t, err)
	req.Header.Set("Tfdist-Protocol", "99")
	req.Header.Set("Tfdist-Job", "aaaa")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	refused = logs.FilterLoggerName("audit").FilterMessage("peer refused").All()
	require.Len(t, refused, 2)
	assert.Contains(t, refused[1].ContextMap()["reason"], `protocol version "99"`)
}
