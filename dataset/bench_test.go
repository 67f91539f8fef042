package dataset_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/pyenv"
)

const (
	benchRecords  = 4096
	benchFeatures = 64
	benchBatch    = 128
)

var benchSpec = dataset.FeatureSpec{
	"x": {Type: tf.Float, Shape: []int64{benchFeatures}},
	"y": {Type: tf.Int32},
}

var (
	benchOnce sync.Once
	benchDir  string
)

// benchFiles writes (once per process) 4 TFRecord files of benchRecords
// tf.Examples in all, each with 64 float32 features and an int label: the
// shape of the digits data set.
func benchFiles(b *testing.B) string {
	benchOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tfdist-dataset-bench")
		require.NoError(b, err)
		rng := rand.New(rand.NewPCG(1, 1))
		recs := make([][][]byte, 4)
		for i := range benchRecords {
			x := make([]float32, benchFeatures)
			for j := range x {
				x[j] = rng.Float32()
			}
			rec, err := dataset.EncodeExample(map[string]any{"x": x, "y": int64(rng.IntN(10))})
			require.NoError(b, err)
			recs[i%4] = append(recs[i%4], rec)
		}
		for f := range recs {
			writeRecords(b, filepath.Join(dir, "part-"+string(rune('0'+f))+".tfrecord"), recs[f])
		}
		benchDir = dir
	})
	return benchDir
}

func benchPipeline(b *testing.B, parallelism int) dataset.Dataset {
	src, err := dataset.TFRecordFiles([]string{benchFiles(b)})
	require.NoError(b, err)
	p, err := dataset.NewExampleParser(benchSpec)
	require.NoError(b, err)
	return dataset.Batched(dataset.ParseExamples(src, p, dataset.WithParallelism(parallelism)), benchBatch, false)
}

// drain reads one pass and returns how long it took.
func drain(b *testing.B, ds dataset.Dataset) time.Duration {
	start := time.Now()
	n := 0
	for e, err := range dataset.All(context.Background(), ds) {
		require.NoError(b, err)
		n += int(e["y"].Shape()[0])
	}
	require.Equal(b, benchRecords, n)
	return time.Since(start)
}

// BenchmarkTFRecordPipeline reads, parses and batches TFRecord files of
// tf.Examples, on the consumer's goroutine and with a parallel parse, in the
// same run so that their ratio is meaningful on a noisy machine.
func BenchmarkTFRecordPipeline(b *testing.B) {
	seq, par := benchPipeline(b, 1), benchPipeline(b, runtime.GOMAXPROCS(0))
	drain(b, seq) // warm the page cache
	b.ResetTimer()
	var tSeq, tPar time.Duration
	for range b.N {
		tSeq += drain(b, seq)
		tPar += drain(b, par)
	}
	records := float64(benchRecords * b.N)
	b.ReportMetric(records/tSeq.Seconds(), "records/s-sequential")
	b.ReportMetric(records/tPar.Seconds(), "records/s-parallel")
	b.ReportMetric(tSeq.Seconds()/tPar.Seconds(), "parallel-speedup")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "parallelism")
}

// stepper simulates a training step: either a fixed sleep or real
// TensorFlow work on each replica's batch (x [B, 64] · W [64, 1024], summed).
type stepFn func(batch *dataset.Batch) error

func matmulStep(b *testing.B) stepFn {
	s := op.NewScope()
	x := op.Placeholder(s.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, benchFeatures)))
	wv := make([][]float32, benchFeatures)
	for i := range wv {
		wv[i] = make([]float32, 1024)
		for j := range wv[i] {
			wv[i][j] = float32(i+j) / 1e4
		}
	}
	wt := op.Const(s.SubScope("weights"), wv)
	h := op.Relu(s.SubScope("relu"), op.MatMul(s.SubScope("matmul"), x, wt))
	h2 := op.MatMul(s.SubScope("matmul2"), h, op.Transpose(s.SubScope("t"), wt, op.Const(s.SubScope("perm"), []int32{1, 0})))
	loss := op.Sum(s.SubScope("sum"), h2, op.Const(s.SubScope("axes"), []int32{0, 1}))
	g, err := s.Finalize()
	require.NoError(b, err)
	sess, err := tf.NewSession(g, nil)
	require.NoError(b, err)
	b.Cleanup(func() { sess.Close() })
	return func(batch *dataset.Batch) error {
		for _, e := range batch.Replicas {
			if _, err := sess.Run(map[tf.Output]*tf.Tensor{x: e["x"]}, []tf.Output{loss}, nil); err != nil {
				return err
			}
		}
		return nil
	}
}

func sleepStep(d time.Duration) stepFn {
	return func(*dataset.Batch) error { time.Sleep(d); return nil }
}

// waitPerStep runs one pass over a Distributed dataset with the given step
// and returns the mean time the loop waited for input per step and the mean
// step time.
func waitPerStep(b *testing.B, prefetch int, step stepFn) (wait, total time.Duration, steps int) {
	d, err := dataset.Distribute(benchPipeline(b, 1), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 2}, 2,
		dataset.WithPrefetch(prefetch))
	require.NoError(b, err)
	ctx := context.Background()
	it, err := d.Iterator(ctx)
	require.NoError(b, err)
	defer it.Close()
	start := time.Now()
	for {
		t0 := time.Now()
		batch, err := it.Next(ctx)
		wait += time.Since(t0)
		if err != nil {
			break
		}
		require.NoError(b, step(batch))
		steps++
	}
	return wait, time.Since(start), steps
}

// BenchmarkInputWait measures how long a training loop waits for its input
// per step, without and with prefetching, when the step is a fixed 2 ms
// sleep and when it is real TensorFlow work. With prefetching the next batch
// is read, parsed, split and made into tensors while the step runs.
func BenchmarkInputWait(b *testing.B) {
	for _, tc := range []struct {
		name string
		step stepFn
	}{
		{"sleep2ms", sleepStep(2 * time.Millisecond)},
		{"tf-matmul", matmulStep(b)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var wait0, wait2, total0, total2 time.Duration
			var steps int
			for range b.N {
				w, t, n := waitPerStep(b, 0, tc.step)
				wait0, total0, steps = wait0+w, total0+t, steps+n
				w, t, _ = waitPerStep(b, 2, tc.step)
				wait2, total2 = wait2+w, total2+t
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(steps) }
			b.ReportMetric(ms(wait0), "wait-ms/step-noprefetch")
			b.ReportMetric(ms(wait2), "wait-ms/step-prefetch")
			b.ReportMetric(ms(total0), "ms/step-noprefetch")
			b.ReportMetric(ms(total2), "ms/step-prefetch")
			b.ReportMetric(wait0.Seconds()/max(wait2.Seconds(), 1e-9), "wait-reduction")
		})
	}
}

const (
	manyFiles       = 64
	manyFileRecords = 256
	imageFeatures   = 784
)

// writeManyFiles writes 64 TFRecord files of 256 tf.Examples each, a
// 784-float image and an int label (about 0.8 MB a file, 52 MB in all),
// into a new directory that ends with the benchmark: a data set sharded
// into many files, as large jobs store theirs.
func writeManyFiles(b *testing.B) string {
	dir := b.TempDir()
	rng := rand.New(rand.NewPCG(2, 2))
	x := make([]float32, imageFeatures)
	for f := range manyFiles {
		var recs [][]byte
		for range manyFileRecords {
			for j := range x {
				x[j] = rng.Float32()
			}
			rec, err := dataset.EncodeExample(map[string]any{"x": x, "y": int64(rng.IntN(10))})
			require.NoError(b, err)
			recs = append(recs, rec)
		}
		writeRecords(b, filepath.Join(dir, fmt.Sprintf("part-%03d.tfrecord", f)), recs)
	}
	return dir
}

// interleavePipeline reads the many files with tf.data's usual pipeline,
// list_files().interleave(lambda f: TFRecordDataset(f).map(parse),
// cycle_length=4, num_parallel_calls=parallel).batch(128): each file parsed
// by the goroutine that reads it.
func interleavePipeline(b *testing.B, dir string, parallel int, opts ...dataset.InterleaveOption) dataset.Dataset {
	files, err := dataset.ListFiles([]string{filepath.Join(dir, "*.tfrecord")})
	require.NoError(b, err)
	p := imageParser(b)
	read := func(e dataset.Element) (dataset.Dataset, error) {
		return parsedFile(e[dataset.FilenameKey].Value().(string), p)
	}
	opts = append(opts, dataset.WithParallelReads(parallel))
	return dataset.Batched(dataset.Interleave(files, read, 4, 1, opts...), benchBatch, false)
}

// parsedFile reads the tf.Examples of one of the many files, parsed by p:
// the pipeline each read of the benchmarks runs per file.
func parsedFile(name string, p *dataset.ExampleParser) (dataset.Dataset, error) {
	src, err := dataset.TFRecordFile(name)
	return dataset.ParseExamples(src, p), err
}

// imageParser parses the many files' tf.Examples.
func imageParser(b *testing.B) *dataset.ExampleParser {
	p, err := dataset.NewExampleParser(dataset.FeatureSpec{
		"x": {Type: tf.Float, Shape: []int64{imageFeatures}},
		"y": {Type: tf.Int32},
	})
	require.NoError(b, err)
	return p
}

// independentPass reads the many files as two goroutines that share
// nothing but a counter of the files taken: each reads, parses and batches
// whole files on its own, as the sequential pipeline does, and hands
// nothing to the other. A parallel Interleave does the same work per
// record and hands every record to one consumer besides, so its speedup
// over the sequential pass cannot be expected to pass this one's. It
// returns the wall time the pass took.
func independentPass(b *testing.B, dir string, p *dataset.ExampleParser) time.Duration {
	files, err := filepath.Glob(filepath.Join(dir, "*.tfrecord"))
	require.NoError(b, err)
	start := time.Now()
	var next, rows atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(files)); i = next.Add(1) - 1 {
				ds, err := parsedFile(files[i], p)
				if err != nil {
					b.Error(err)
					return
				}
				for e, err := range dataset.All(context.Background(), dataset.Batched(ds, benchBatch, false)) {
					if err != nil {
						b.Error(err)
						return
					}
					rows.Add(e["y"].Shape()[0])
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(b, int64(manyFiles*manyFileRecords), rows.Load())
	return time.Since(start)
}

// BenchmarkInterleave reads and parses 64 TFRecord files four at a time,
// sequentially (on the consumer's goroutine), with four parallel reads, and
// with four parallel reads in no fixed order (Deterministic(false)),
// alternating them in the same run so that their ratios are meaningful on
// a noisy machine: at Go's default GOGC=100, and at GOGC=400, as the
// collector's share of the work decides how far parallel reads scale. It
// also reports the CPUs each way kept busy (the process's CPU time over the
// wall time): the collector runs beside even a sequential read, so on 2
// cores the speedup cannot pass 2 ÷ cpus-sequential. It times, in the same
// loop, two goroutines that read whole files each on its own, sharing
// nothing (independent-speedup, see independentPass): what parallel reads
// could gain on the machine if no record crossed between goroutines. Last,
// it measures what two goroutines gain over one on this machine for a
// record's own work, allocating and filling a parsed record's floats
// (copy-scaling), for copies between 16 MiB buffers with no allocation
// (memcpy-scaling), and for a loop that touches no memory (scalar-scaling):
// where memory, not the cores, is the limit, memcpy-scaling stays near 1
// however many cores there are.
func BenchmarkInterleave(b *testing.B) {
	dir := writeManyFiles(b)
	seq, par := interleavePipeline(b, dir, 1), interleavePipeline(b, dir, 4)
	loose := interleavePipeline(b, dir, 4, dataset.Deterministic(false))
	p := imageParser(b)
	readPass(b, seq) // warm the page cache
	for _, gogc := range []int{100, 400} {
		b.Run(fmt.Sprintf("GOGC=%d", gogc), func(b *testing.B) {
			defer debug.SetGCPercent(debug.SetGCPercent(gogc))
			var tSeq, tPar, tLoose, tIndep, cSeq, cPar time.Duration
			for range b.N {
				w, c := readPass(b, seq)
				tSeq, cSeq = tSeq+w, cSeq+c
				w, c = readPass(b, par)
				tPar, cPar = tPar+w, cPar+c
				w, _ = readPass(b, loose)
				tLoose += w
				tIndep += independentPass(b, dir, p)
			}
			records := float64(manyFiles * manyFileRecords * b.N)
			b.ReportMetric(records/tSeq.Seconds(), "records/s-sequential")
			b.ReportMetric(records/tPar.Seconds(), "records/s-parallel")
			b.ReportMetric(tSeq.Seconds()/tPar.Seconds(), "parallel-speedup")
			b.ReportMetric(tSeq.Seconds()/tLoose.Seconds(), "nondeterministic-speedup")
			b.ReportMetric(tSeq.Seconds()/tIndep.Seconds(), "independent-speedup")
			b.ReportMetric(cSeq.Seconds()/tSeq.Seconds(), "cpus-sequential")
			b.ReportMetric(cPar.Seconds()/tPar.Seconds(), "cpus-parallel")
			// What two goroutines gain over one on this machine's CPUs,
			// for the work a record costs (a parsed record's allocation
			// and copy) and for a scalar loop: the ceiling of any
			// parallel read.
			b.StopTimer()
			b.ReportMetric(scaling(copyRecords), "copy-scaling")
			b.ReportMetric(memcpyScaling(b), "memcpy-scaling")
			b.ReportMetric(scaling(scalarLoop), "scalar-scaling")
		})
	}
}

// readPass reads every batch of the many files from ds and returns the
// wall time and the process's CPU time it took.
func readPass(b *testing.B, ds dataset.Dataset) (wall, cpu time.Duration) {
	start, cpu0 := time.Now(), processCPU(b)
	n := 0
	for e, err := range dataset.All(context.Background(), ds) {
		require.NoError(b, err)
		n += int(e["y"].Shape()[0])
	}
	require.Equal(b, manyFiles*manyFileRecords, n)
	return time.Since(start), processCPU(b) - cpu0
}

// BenchmarkInterleaveAgainstTFData reads and parses the many files of
// BenchmarkInterleave with tfdist's pipeline and with tf.data's, in Python
// TensorFlow 2.18 (the cached virtual environment, as the tests that
// compare with tf.data use), each sequentially and with 4 parallel reads.
// tf.data runs the same pipeline (parse_single_example per record), and
// its faster form that parses whole batches (parse_example after batch);
// see testdata/tfdata_interleave_bench.py. It reports every pipeline's
// milliseconds per pass and tf.data's time over tfdist's. tfdist's passes
// run half before tf.data's and half after, so that a change in the
// machine's load shows in neither alone. Run with -benchtime 1x.
func BenchmarkInterleaveAgainstTFData(b *testing.B) {
	const passes = 4
	dir := writeManyFiles(b)
	seq, par := interleavePipeline(b, dir, 1), interleavePipeline(b, dir, 4)
	for range b.N {
		readPass(b, seq) // warm the page cache and the parser's pools
		readPass(b, par)
		var tSeq, tPar time.Duration
		half := func() {
			for range passes / 2 {
				w, _ := readPass(b, seq)
				tSeq += w
				w, _ = readPass(b, par)
				tPar += w
			}
		}
		half()
		var tfdata map[string]map[string]float64
		pyenv.TensorFlow(b).JSON(b, filepath.Join("testdata", "tfdata_interleave_bench.py"), map[string]any{
			"pattern": filepath.Join(dir, "*.tfrecord"), "records": manyFiles * manyFileRecords,
			"passes": passes, "batch": benchBatch, "features": imageFeatures}, &tfdata)
		half()
		ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / passes }
		b.ReportMetric(ms(tSeq), "tfdist-sequential-ms")
		b.ReportMetric(ms(tPar), "tfdist-parallel-ms")
		b.ReportMetric(tSeq.Seconds()/tPar.Seconds(), "tfdist-speedup")
		for _, form := range []string{"per_record", "batched"} {
			t := tfdata[form]
			b.ReportMetric(t["sequential"]*1e3, "tfdata-"+form+"-sequential-ms")
			b.ReportMetric(t["parallel"]*1e3, "tfdata-"+form+"-parallel-ms")
			b.ReportMetric(t["sequential"]/t["parallel"], "tfdata-"+form+"-speedup")
			b.ReportMetric(t["parallel"]*1e3/ms(tPar), "tfdata-"+form+"-parallel/tfdist-parallel")
		}
	}
}

// scaling returns how many times faster two goroutines do work(n) between
// them, each work(n/2), than one goroutine does work(n): the best of three
// tries each way.
func scaling(work func(n int)) float64 {
	const n = 1 << 16
	best := func(f func()) time.Duration {
		d := time.Duration(1<<63 - 1)
		for range 3 {
			start := time.Now()
			f()
			d = min(d, time.Since(start))
		}
		return d
	}
	one := best(func() { work(n) })
	two := best(func() {
		var wg sync.WaitGroup
		wg.Add(2)
		for range 2 {
			go func() {
				defer wg.Done()
				work(n / 2)
			}()
		}
		wg.Wait()
	})
	return one.Seconds() / two.Seconds()
}

// recordSink keeps copyRecords' allocations from being optimised away.
var recordSink atomic.Pointer[[]float32]

// copyRecords allocates n slices of a parsed record's floats and copies
// the record's values into each, as ExampleParser does for every record.
func copyRecords(n int) {
	src := make([]float32, imageFeatures)
	for range n {
		dst := make([]float32, imageFeatures)
		copy(dst, src)
		recordSink.Store(&dst)
	}
}

// memcpyScaling returns scaling of copies of 16 MiB from one buffer to
// another, with no allocation: what memory alone allows, next to
// copyRecords. Its buffers, far larger than a core's cache, are mapped
// apart from Go's heap, which they would otherwise swell for the
// collector's pacing of the measurements that follow.
func memcpyScaling(b *testing.B) float64 {
	pairs := make(chan [2][]byte, 2)
	for range 2 {
		var p [2][]byte
		for i := range p {
			m, err := syscall.Mmap(-1, 0, 16<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			require.NoError(b, err)
			defer syscall.Munmap(m)
			for j := range m {
				m[j] = byte(j)
			}
			p[i] = m
		}
		pairs <- p
	}
	return scaling(func(n int) {
		p := <-pairs
		defer func() { pairs <- p }()
		for range n / 4096 {
			copy(p[1], p[0])
		}
	})
}

// scalarSink keeps scalarLoop's result.
var scalarSink atomic.Uint64

// scalarLoop runs a loop of n×1,000 dependent integer operations that
// touches no memory.
func scalarLoop(n int) {
	x := uint64(n)
	for i := range n * 1000 {
		x = x*6364136223846793005 + uint64(i)
	}
	scalarSink.Store(x)
}

// processCPU returns the CPU time the process has used, in user and kernel
// mode.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
