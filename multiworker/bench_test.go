package multiworker_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/allreducebench"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// The benchmarks re-execute this test binary as their worker processes,
// which play the role allreducebench.RoleEnv names, and the tests of a
// peer's failures as the peer (see runPeer).
func TestMain(m *testing.M) {
	if code, ok := allreducebench.RunRole(); ok {
		os.Exit(code)
	}
	if code, ok := runPeer(); ok {
		os.Exit(code)
	}
	if code, ok := runElasticWorker(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// BenchmarkAllReduce all-reduces 1, 16 and 64 MiB of float32 between 2 and 3
// worker processes on loopback, on tfdist's collective engine (over shared
// memory, its default between processes on one host, and over TCP, as
// between hosts) and on TensorFlow's ring all-reduce over gRPC, and
// reports the algorithm bandwidth (bytes / time per all-reduce) and time
// of each, tfdist's ratios to TensorFlow, and each one's ratio to what a
// plain TCP copy between two processes reaches in the same run. Run with
// -benchtime 1x: each iteration starts the worker processes.
func BenchmarkAllReduce(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	self := allreducebench.Exec{Path: os.Args[0]}
	for range b.N {
		tcp, err := allreducebench.TCPBandwidth(ctx, self, allreducebench.TCPBytes)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(tcp/(1<<20), "tcp_MiB/s")
		for _, workers := range []int{2, 3} {
			runs := []struct {
				name string
				c    allreducebench.Config
			}{
				{"tfdist", allreducebench.Config{Backend: allreducebench.Tfdist}},
				{"tfdist-tcp", allreducebench.Config{Backend: allreducebench.Tfdist, TCP: true}},
				{"tensorflow", allreducebench.Config{Backend: allreducebench.TensorFlow}},
			}
			sizes := []int64{1 << 20, 16 << 20, 64 << 20}
			ts := map[string][]allreducebench.Timing{}
			for _, r := range runs {
				r.c.Sizes = sizes
				res, err := allreducebench.AllReduce(ctx, self, workers, r.c)
				if err != nil {
					b.Fatalf("%s, %d workers: %v", r.name, workers, err)
				}
				ts[r.name] = res.Timings
			}
			for i, size := range sizes {
				name := fmt.Sprintf("%dw_%dMiB", workers, size>>20)
				for _, r := range runs {
					t := ts[r.name][i]
					b.ReportMetric(t.Seconds*1e3, fmt.Sprintf("%s_%s_ms", name, r.name))
					b.ReportMetric(t.BusBW(workers)/tcp, fmt.Sprintf("%s_%s_busbw/tcp", name, r.name))
				}
				for _, r := range runs[:2] {
					b.ReportMetric(ts["tensorflow"][i].Seconds/ts[r.name][i].Seconds, fmt.Sprintf("%s_%s/tensorflow", name, r.name))
				}
			}
		}
	}
}

// BenchmarkOverlap trains an MLP 64-2048-2048-10 (17 MiB of gradients) on 2
// worker processes with tfdist's engine and reports, from one run, a step's
// time beside the same step's compute alone (the default strategy, in both
// processes at once) and the all-reduce of its gradients alone (the same
// packs of 4 MiB), and the share of the all-reduce that the step hides
// behind backprop: (compute + all-reduce - step) / all-reduce. Run with
// -benchtime 1x.
func BenchmarkOverlap(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	self := allreducebench.Exec{Path: os.Args[0]}
	c := allreducebench.Config{Backend: allreducebench.Tfdist, Model: []int{64, 2048, 2048, 10}, Batch: 128,
		BytesPerPack: 4 << 20, Iters: 20, Warmup: 3}
	for range b.N {
		res, err := allreducebench.AllReduce(ctx, self, 2, c)
		if err != nil {
			b.Fatal(err)
		}
		reportOverlap(b, res, "")
	}
}

// reportOverlap reports an overlap measurement's compute, all-reduce and
// step times and the share of the all-reduce the step hides, the last
// three's names ending in suffix, and returns the all-reduce's seconds.
func reportOverlap(b *testing.B, res allreducebench.Result, suffix string) float64 {
	t := map[string]float64{}
	for _, x := range res.Timings {
		t[x.Label] = x.Seconds
	}
	compute, comm, step := t[allreducebench.LabelCompute], t[allreducebench.LabelAllReduce], t[allreducebench.LabelStep]
	b.ReportMetric(compute*1e3, "compute_ms")
	b.ReportMetric(comm*1e3, "allreduce"+suffix+"_ms")
	b.ReportMetric(step*1e3, "step"+suffix+"_ms")
	b.ReportMetric((compute+comm-step)/comm, "hidden"+suffix)
	return comm
}

// BenchmarkOnLinks measures, on 2 emulated hosts joined by links of
// 1 Gbit/s and of 10 Gbit/s (0.2 ms; package emunet, as root), each
// worker with one intra-op thread (a core each), in one run per link: the
// step of an MLP of six 1024x1024 layers (24 MiB of gradients, in packs of
// 4 MiB, each all-reduced as backprop produces it) on 256 examples,
// beside its compute alone and its gradients' all-reduce alone, plainly
// and with fp16 compression; and the all-reduce of 16 and 64 MiB, plainly
// and in fp16. It reports the share of the all-reduce the step hides
// (hidden, hidden_fp16: (compute + all-reduce - step) / all-reduce) and
// fp16's speed-up of the all-reduce alone and of each size (float32 time
// / fp16 time). Run with -benchtime 1x.
func BenchmarkOnLinks(b *testing.B) {
	if err := emunet.Available(); err != nil {
		b.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for _, spec := range []string{"1gbit,0.2ms", "10gbit,0.2ms"} {
		b.Run("link="+spec, func(b *testing.B) {
			x := twoHosts(b, spec)
			for range b.N {
				overlapOnLink(ctx, b, x)
				sizesOnLink(ctx, b, x)
			}
		})
	}
}

// BenchmarkHidingOnLink measures, on BenchmarkOnLinks's 1 Gbit/s link,
// the step of its MLP on 256, 1024 and 2048 examples a worker, beside its
// compute alone and its gradients' all-reduce alone, in one run: the share
// of the all-reduce the step hides (hidden) where the compute is shorter
// than the all-reduce and where it is longer. Run with -benchtime 1x.
func BenchmarkHidingOnLink(b *testing.B) {
	if err := emunet.Available(); err != nil {
		b.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	x := twoHosts(b, "1gbit,0.2ms")
	for _, batch := range []int{256, 1024, 2048} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			c := overlapConfig(batch)
			for range b.N {
				res, err := allreducebench.AllReduce(ctx, x, 2, c)
				require.NoError(b, err)
				reportOverlap(b, res, "")
			}
		})
	}
}

// twoHosts returns how to run this test binary on 2 emulated hosts joined
// by a link of spec, each worker with one intra-op thread; the hosts go
// when b ends.
func twoHosts(b *testing.B, spec string) allreducebench.Exec {
	l, err := emunet.ParseLink(spec)
	require.NoError(b, err)
	nw, err := emunet.New(2, l)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, nw.Close()) })
	return allreducebench.Exec{Path: os.Args[0], Net: nw, Env: []string{"TF_NUM_INTRAOP_THREADS=1"}}
}

// overlapConfig is the overlap benchmarks' MLP step on batch examples a
// worker.
func overlapConfig(batch int) allreducebench.Config {
	return allreducebench.Config{Backend: allreducebench.Tfdist, Model: []int{1024, 1024, 1024, 1024, 1024, 1024, 1024, 10}, Batch: batch,
		BytesPerPack: 4 << 20, Iters: 10, Warmup: 3}
}

// overlapOnLink reports the step's, compute's and all-reduce's times on
// x's hosts, plainly and with fp16 gradients.
func overlapOnLink(ctx context.Context, b *testing.B, x allreducebench.Exec) {
	c := overlapConfig(256)
	comm := map[string]float64{}
	for _, comp := range []string{"", "fp16"} {
		c.Compression = comp
		res, err := allreducebench.AllReduce(ctx, x, 2, c)
		require.NoError(b, err)
		comm[comp] = reportOverlap(b, res, map[string]string{"": "", "fp16": "_fp16"}[comp])
	}
	b.ReportMetric(comm[""]/comm["fp16"], "allreduce_fp16_speedup")
}

// sizesOnLink reports the all-reduce of 16 and 64 MiB on x's hosts,
// plainly and in fp16, and fp16's speed-up.
func sizesOnLink(ctx context.Context, b *testing.B, x allreducebench.Exec) {
	c := allreducebench.Config{Backend: allreducebench.Tfdist, Sizes: []int64{16 << 20, 64 << 20}, Iters: 5, Warmup: 2}
	plain, err := allreducebench.AllReduce(ctx, x, 2, c)
	require.NoError(b, err)
	c.Compression = "fp16"
	fp16, err := allreducebench.AllReduce(ctx, x, 2, c)
	require.NoError(b, err)
	for i, t := range plain.Timings {
		name := fmt.Sprintf("%dMiB", t.Bytes>>20)
		b.ReportMetric(t.Seconds*1e3, name+"_ms")
		b.ReportMetric(fp16.Timings[i].Seconds*1e3, name+"_fp16_ms")
		b.ReportMetric(t.Seconds/fp16.Timings[i].Seconds, name+"_fp16_speedup")
	}
}

// BenchmarkZeRO measures the step of the MLP of BenchmarkOnLinks (24 MiB
// of gradients in packs of 4 MiB, 256 examples a worker) with Adam,
// unsharded and with the optimizer state sharded at stage 1, alternately
// three times each in one run, 30 steps each time, on 2 workers of this
// machine (shared memory) and, as root, on 2 emulated hosts joined by a
// 10 Gbit/s link (0.2 ms): the median step of each, and the sharded
// step's speed against the unsharded one's (speed, unsharded time /
// sharded time). Run with -benchtime 1x.
func BenchmarkZeRO(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	hosts := map[string]func(*testing.B) allreducebench.Exec{
		"shm": func(*testing.B) allreducebench.Exec { return allreducebench.Exec{Path: os.Args[0]} },
	}
	if emunet.Available() == nil {
		hosts["link=10gbit,0.2ms"] = func(b *testing.B) allreducebench.Exec { return twoHosts(b, "10gbit,0.2ms") }
	}
	for name, x := range hosts {
		b.Run(name, func(b *testing.B) {
			x := x(b)
			for range b.N {
				var steps [2][]float64
				for range 3 {
					for stage := range 2 {
						c := overlapConfig(256)
						c.Adam, c.ZeRO, c.Iters = true, stage, 30
						res, err := allreducebench.AllReduce(ctx, x, 2, c)
						require.NoError(b, err)
						steps[stage] = append(steps[stage], stepSeconds(res))
					}
				}
				plain, sharded := median(steps[0]), median(steps[1])
				b.ReportMetric(plain*1e3, "step_ms")
				b.ReportMetric(sharded*1e3, "step_zero_ms")
				b.ReportMetric(plain/sharded, "speed")
			}
		})
	}
}

// stepSeconds returns the distributed step's seconds of an overlap
// measurement.
func stepSeconds(res allreducebench.Result) float64 {
	for _, x := range res.Timings {
		if x.Label == allreducebench.LabelStep {
			return x.Seconds
		}
	}
	return 0
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkReducedLoss trains the classifier (global batch 64) on 2 workers
// of 2 replicas each, in this process on tfdist's engine, and gets each
// step's global loss two ways, alternately in one run: summed in the
// step's own run (Replica.ReduceOutput), and returned per replica and
// summed by Reduce after the run, a second Session.Run and a second
// collective. It reports worker 0's time per step of each way and their
// ratio, in-run / run+Reduce. Run with -benchtime 1x: each iteration
// starts the workers and times 200 steps each way.
func BenchmarkReducedLoss(b *testing.B) {
	d, err := digits.Load()
	require.NoError(b, err)
	const gb, per, steps = 64, 16, 200
	var inRun, runReduce time.Duration
	for range b.N {
		errs := onWorkers(loopbackSpec(b, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
			multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
			func(w int, s *multiworker.Strategy) error {
				var model *nn.Sequential
				if err := s.Scope(func(sc strategy.Scope) (err error) {
					model, err = models.New(sc, "mlp", 64, 1)
					return err
				}); err != nil {
					return err
				}
				feeds := make([]map[string]*tf.Tensor, 2)
				for r := range feeds {
					lo := (2*w + r) * per
					xt, _ := tf.NewTensor(d.X[lo : lo+per])
					yt, _ := tf.NewTensor(d.Y[lo : lo+per])
					feeds[r] = map[string]*tf.Tensor{"x": xt, "y": yt}
				}
				lt, err := reducedtest.NewLossTimer(s, models.Spec, models.TrainStep(model, optimizer.NewSGD(optimizer.Constant(0.1))), feeds, gb)
				if err != nil {
					return err
				}
				for i := range 20 + steps {
					if i == 20 { // after the warm-up
						lt.Reset()
					}
					if err := lt.Step(context.Background()); err != nil {
						return err
					}
				}
				if w == 0 {
					inRun, runReduce = inRun+lt.InRun, runReduce+lt.RunReduce
				}
				return nil
			})
		require.NoError(b, errs[0])
		require.NoError(b, errs[1])
	}
	b.ReportMetric(float64(inRun.Microseconds())/float64(b.N*steps), "inrun_us/step")
	b.ReportMetric(float64(runReduce.Microseconds())/float64(b.N*steps), "run+reduce_us/step")
	b.ReportMetric(inRun.Seconds()/runReduce.Seconds(), "inrun/run+reduce")
}

// BenchmarkTopK times steps whose gradient is one dense 64 MiB float32
// tensor on 2 in-process workers, all-reduced densely and with TopK(0.01),
// and reports the time per step of each and their ratio (topk/dense), and
// the bytes a worker sent per step. The step computes little besides the
// gradient, so the ratio is the all-reduce's: top-k selection, gathers
// and the scatter against the ring.
func BenchmarkTopK(b *testing.B) {
	const n, steps = 16 << 20, 5
	perStep := map[string]float64{}
	for range b.N {
		for _, comp := range []multiworker.Compression{multiworker.None, multiworker.TopK(0.01)} {
			times := make([]time.Duration, 2)
			sent := make([]int64, 2)
			errs := onWorkers(loopbackSpec(b, 2), []multiworker.Option{multiworker.WithCompression(comp),
				multiworker.WithStartupTimeout(time.Minute), multiworker.WithCollectiveTimeout(time.Minute)},
				func(w int, s *multiworker.Strategy) error {
					var err error
					times[w], sent[w], err = timeGradientSteps(s, n, steps)
					return err
				})
			for _, err := range errs {
				require.NoError(b, err)
			}
			perStep[comp.String()] = times[0].Seconds() / steps
			b.ReportMetric(times[0].Seconds()/steps*1e3, comp.String()+"_ms/step")
			b.ReportMetric(float64(sent[0])/steps/(1<<20), comp.String()+"_MiB_sent/step")
		}
	}
	b.ReportMetric(perStep["topk(0.01)"]/perStep["none"], "topk/dense_time")
}

// timeGradientSteps builds a step whose gradient is a dense tensor of n
// float32 values, runs it once, then times steps more runs; it returns
// their time and the bytes this worker sent during them.
func timeGradientSteps(s *multiworker.Strategy, n int64, steps int) (time.Duration, int64, error) {
	var v strategy.Variable
	if err := s.Scope(func(sc strategy.Scope) (err error) {
		v, err = sc.Variable("w", tf.Float, []int64{n}, strategy.Zeros())
		return err
	}); err != nil {
		return 0, 0, err
	}
	step, err := s.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := r.Scope()
		g := op.StatelessRandomNormal(sc.SubScope("g"), op.Const(sc.SubScope("shape"), []int64{n}),
			op.Const(sc.SubScope("seed"), []int64{int64(r.ReplicaID()), 1}))
		loss := op.AddV2(sc.SubScope("loss"), op.Sum(sc.SubScope("wg"), op.Mul(sc.SubScope("mul"), strategy.MustRead(r, v), g), op.Const(sc.SubScope("a"), []int32{0})),
			op.Sum(sc.SubScope("x"), in["x"], op.Const(sc.SubScope("b"), []int32{0})))
		return strategy.Outputs{"loss": loss}, r.Minimize(optimizer.NewSGD(optimizer.Constant(1e-3)), loss, []strategy.Variable{v})
	})
	if err != nil {
		return 0, 0, err
	}
	x, err := tf.NewTensor([]float32{0})
	if err != nil {
		return 0, 0, err
	}
	feeds := []map[string]*tf.Tensor{{"x": x}}
	ctx := context.Background()
	if _, err := s.RunReplicas(ctx, step, feeds, 1); err != nil {
		return 0, 0, err
	}
	before, start := s.CollectiveStats().BytesSent, time.Now()
	for range steps {
		if _, err := s.RunReplicas(ctx, step, feeds, 1); err != nil {
			return 0, 0, err
		}
	}
	return time.Since(start), s.CollectiveStats().BytesSent - before, nil
}
