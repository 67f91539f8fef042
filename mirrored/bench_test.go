package mirrored_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

const benchBatch = 64

// rawLoop is the classifier's training step written directly against graft:
// one device, one session, no strategy. It is the baseline the strategies
// are measured against.
type rawLoop struct {
	sess  *tf.Session
	x, y  tf.Output
	loss  tf.Output
	train *tf.Operation
}

func newRawLoop(t testing.TB) *rawLoop {
	s := op.NewScope()
	dev := s.WithDevice(strategy.LocalCPU(0))
	x := op.Placeholder(dev.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, digits.Features)))
	y := op.Placeholder(dev.SubScope("y"), tf.Int32, op.PlaceholderShape(tf.MakeShape(-1)))
	sizes := []int64{digits.Features, 64, digits.Classes}
	var handles, reads []tf.Output
	var inits []*tf.Operation
	h := x
	for i := 0; i+1 < len(sizes); i++ {
		ls := dev.SubScope(fmt.Sprintf("dense_%d", i))
		init, err := nn.GlorotUniform(int64(1+i))(ls.SubScope("init"), tf.Float, sizes[i:i+2])
		require.NoError(t, err)
		w := op.VarHandleOp(ls.SubScope("w"), tf.Float, tf.MakeShape(sizes[i:i+2]...), op.VarHandleOpSharedName(fmt.Sprintf("w%d", i)))
		b := op.VarHandleOp(ls.SubScope("b"), tf.Float, tf.MakeShape(sizes[i+1]), op.VarHandleOpSharedName(fmt.Sprintf("b%d", i)))
		inits = append(inits, op.AssignVariableOp(ls.SubScope("wi"), w, init),
			op.AssignVariableOp(ls.SubScope("bi"), b, op.Fill(ls.SubScope("zeros"), op.Const(ls.SubScope("bs"), []int64{sizes[i+1]}), op.Const(ls.SubScope("z"), float32(0)))))
		wr := op.ReadVariableOp(ls.SubScope("wr"), w, tf.Float)
		br := op.ReadVariableOp(ls.SubScope("br"), b, tf.Float)
		handles, reads = append(handles, w, b), append(reads, wr, br)
		h = op.BiasAdd(ls.SubScope("bias"), op.MatMul(ls.SubScope("mm"), h, wr), br)
		if i+2 < len(sizes) {
			h = op.Relu(ls.SubScope("relu"), h)
		}
	}
	ce := nn.SparseSoftmaxCrossEntropy(dev.SubScope("xent"), h, y, digits.Classes)
	loss := op.Mean(dev.SubScope("loss"), ce, op.Const(dev.SubScope("axis"), int32(0)))
	g, err := s.Finalize()
	require.NoError(t, err)
	grads, err := g.AddGradients("grads", []tf.Output{loss}, reads, nil)
	require.NoError(t, err)
	s2 := op.NewScopeWithGraph(g).SubScope("apply").WithDevice(strategy.LocalCPU(0))
	var ups []*tf.Operation
	for i, hd := range handles {
		ups = append(ups, op.ResourceApplyGradientDescent(s2.SubScope(fmt.Sprint(i)), hd, op.Const(s2.SubScope(fmt.Sprint("lr", i)), float32(0.1)), grads[i]))
	}
	train := op.NoOp(s2.SubScope("train").WithControlDependencies(ups...))
	initOp := op.NoOp(s2.SubScope("init").WithControlDependencies(inits...))
	require.NoError(t, s2.Err())
	intra, inter, err := tfrt.DefaultThreads()
	require.NoError(t, err)
	so, err := tfrt.SessionOptions("", tfrt.WithThreads(intra, inter))
	require.NoError(t, err)
	sess, err := tf.NewSession(g, so)
	require.NoError(t, err)
	_, err = sess.Run(nil, nil, []*tf.Operation{initOp})
	require.NoError(t, err)
	return &rawLoop{sess: sess, x: x, y: y, loss: loss, train: train}
}

func (r *rawLoop) step(t testing.TB, x, y *tf.Tensor) {
	_, err := r.sess.Run(map[tf.Output]*tf.Tensor{r.x: x, r.y: y}, []tf.Output{r.loss}, []*tf.Operation{r.train})
	require.NoError(t, err)
}

type engineLoop struct {
	name  string
	e     testmodel.Engine
	step  strategy.Step
	feeds []map[string]*tf.Tensor
}

func newEngineLoop(t testing.TB, name string, e testmodel.Engine, x [][]float32, y []int32) *engineLoop {
	var m *nn.MLP
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		m, err = nn.NewMLP(sc, "mlp", []int{digits.Features, 64, digits.Classes}, 1)
		return err
	}))
	opt := optimizer.NewSGD(optimizer.Constant(0.1))
	step, err := e.Build(testmodel.Spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		logits, err := m.Apply(rc, in["x"])
		if err != nil {
			return nil, err
		}
		loss := rc.AverageLoss(nn.SparseSoftmaxCrossEntropy(rc.Scope().SubScope("loss"), logits, in["y"], digits.Classes))
		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, m.Vars())
	})
	require.NoError(t, err)
	n := e.NumLocalReplicas()
	per := len(y) / n
	feeds := make([]map[string]*tf.Tensor, n)
	for r := range n {
		xt, _ := tf.NewTensor(x[r*per : (r+1)*per])
		yt, _ := tf.NewTensor(y[r*per : (r+1)*per])
		feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
	}
	return &engineLoop{name: name, e: e, step: step, feeds: feeds}
}

// BenchmarkClassifierStep times one training step of the classifier (global
// batch 64) under a hand-written graft loop, the default strategy and
// Mirrored on 1, 2 and 4 logical CPUs, interleaved in one run, and reports
// each one's steps/s and its time relative to the raw loop.
func BenchmarkClassifierStep(b *testing.B) {
	d, err := digits.Load()
	require.NoError(b, err)
	x, y := d.X[:benchBatch], d.Y[:benchBatch]
	xt, _ := tf.NewTensor(x)
	yt, _ := tf.NewTensor(y)
	raw := newRawLoop(b)
	def, err := onedevice.New()
	require.NoError(b, err)
	loops := []*engineLoop{newEngineLoop(b, "default", def, x, y)}
	for _, n := range []int{1, 2, 4} {
		m, err := mirrored.New(mirrored.WithLogicalCPUs(n))
		require.NoError(b, err)
		loops = append(loops, newEngineLoop(b, fmt.Sprintf("mirrored%d", n), m, x, y))
	}
	ctx := context.Background()
	for range 20 { // warm up
		raw.step(b, xt, yt)
		for _, l := range loops {
			_, err := l.e.RunReplicas(ctx, l.step, l.feeds, benchBatch)
			require.NoError(b, err)
		}
	}
	var rawTime time.Duration
	times := make([]time.Duration, len(loops))
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		raw.step(b, xt, yt)
		rawTime += time.Since(start)
		for i, l := range loops {
			start := time.Now()
			_, err := l.e.RunReplicas(ctx, l.step, l.feeds, benchBatch)
			times[i] += time.Since(start)
			require.NoError(b, err)
		}
	}
	b.ReportMetric(float64(b.N)/rawTime.Seconds(), "raw_steps/s")
	for i, l := range loops {
		b.ReportMetric(float64(b.N)/times[i].Seconds(), l.name+"_steps/s")
		b.ReportMetric(float64(times[i])/float64(rawTime), l.name+"/raw")
	}
	b.ReportMetric(float64(b.N*benchBatch)/times[len(loops)-1].Seconds(), "mirrored4_examples/s")
}

// BenchmarkInputWait trains the classifier on Mirrored with 2 logical CPUs
// from the real input pipeline (shuffle, batch 64, split per replica) and
// reports the share of each step spent waiting for input, without and with
// prefetching, in one run.
func BenchmarkInputWait(b *testing.B) {
	d, err := digits.Load()
	require.NoError(b, err)
	ctx := context.Background()
	for _, prefetch := range []int{0, 2} {
		m, err := mirrored.New(mirrored.WithLogicalCPUs(2))
		require.NoError(b, err)
		l := newEngineLoop(b, "mirrored2", m, d.X[:benchBatch], d.Y[:benchBatch])
		ds, err := dataset.FromSlices(map[string]any{"x": d.X, "y": d.Y})
		require.NoError(b, err)
		ds = dataset.Take(dataset.Batched(dataset.Repeat(dataset.Shuffle(ds, d.Len(), 1), -1), benchBatch, true), b.N+20)
		dist, err := m.DistributeDataset(ds, dataset.WithPrefetch(prefetch))
		require.NoError(b, err)
		it, err := dist.Iterator(ctx)
		require.NoError(b, err)
		var wait, total time.Duration
		for i := range b.N + 20 {
			start := time.Now()
			batch, err := it.Next(ctx)
			require.NoError(b, err)
			waited := time.Since(start)
			_, err = m.Run(ctx, l.step, batch)
			require.NoError(b, err)
			if i >= 20 { // warm-up steps are not counted
				wait += waited
				total += time.Since(start)
			}
		}
		it.Close()
		m.Close()
		name := "noprefetch"
		if prefetch > 0 {
			name = "prefetch"
		}
		b.ReportMetric(100*wait.Seconds()/total.Seconds(), "%wait_"+name)
		b.ReportMetric(float64(total.Microseconds())/float64(b.N), "us/step_"+name)
	}
}

// BenchmarkReducedLoss trains the classifier (global batch 64) on Mirrored
// with 2 and 4 logical CPUs and gets each step's global loss two ways,
// alternately in one run: summed in the step's own run
// (Replica.ReduceOutput), and returned per replica and summed by Reduce
// after the run, a second Session.Run. It reports each way's time per step
// and their ratio, in-run / run+Reduce.
func BenchmarkReducedLoss(b *testing.B) {
	d, err := digits.Load()
	require.NoError(b, err)
	ctx := context.Background()
	var timers []*reducedtest.LossTimer
	for _, n := range []int{2, 4} {
		m, err := mirrored.New(mirrored.WithLogicalCPUs(n))
		require.NoError(b, err)
		defer m.Close()
		var model *nn.Sequential
		require.NoError(b, m.Scope(func(sc strategy.Scope) error {
			model, err = models.New(sc, "mlp", 64, 1)
			return err
		}))
		feeds := splitFeeds(d.X[:benchBatch], d.Y[:benchBatch], n)
		lt, err := reducedtest.NewLossTimer(m, models.Spec, models.TrainStep(model, optimizer.NewSGD(optimizer.Constant(0.1))), feeds, benchBatch)
		require.NoError(b, err)
		timers = append(timers, lt)
	}
	for _, lt := range timers {
		for range 20 { // warm up
			require.NoError(b, lt.Step(ctx))
		}
		lt.Reset()
	}
	b.ResetTimer()
	for range b.N {
		for _, lt := range timers {
			require.NoError(b, lt.Step(ctx))
		}
	}
	for i, n := range []int{2, 4} {
		lt := timers[i]
		b.ReportMetric(float64(lt.InRun.Microseconds())/float64(b.N), fmt.Sprintf("mirrored%d_inrun_us/step", n))
		b.ReportMetric(float64(lt.RunReduce.Microseconds())/float64(b.N), fmt.Sprintf("mirrored%d_run+reduce_us/step", n))
		b.ReportMetric(lt.InRun.Seconds()/lt.RunReduce.Seconds(), fmt.Sprintf("mirrored%d_inrun/run+reduce", n))
	}
}

// splitFeeds gives each of n replicas its slice of the batch x, y.
func splitFeeds(x [][]float32, y []int32, n int) []map[string]*tf.Tensor {
	per := len(y) / n
	feeds := make([]map[string]*tf.Tensor, n)
	for r := range n {
		xt, _ := tf.NewTensor(x[r*per : (r+1)*per])
		yt, _ := tf.NewTensor(y[r*per : (r+1)*per])
		feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
	}
	return feeds
}
