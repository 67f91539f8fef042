// Package allreducebench measures MultiWorkerMirrored's all-reduce between
// worker processes on this machine, beside a plain TCP copy between two
// processes for reference.
//
// A benchmark re-executes a program as its processes: the program calls
// RunRole first thing in main (or TestMain), which plays the role that
// RoleEnv names, if any. AllReduce starts the worker processes of one
// measurement and returns worker 0's timings; TCPBandwidth starts a sender
// process and times the copy it receives.
package allreducebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// Environment variables of the benchmark's processes.
const (
	// RoleEnv names the role a re-executed process plays: RoleAllReduce or
	// RoleTCPSend.
	RoleEnv = "TFDIST_ALLREDUCEBENCH_ROLE"
	// ConfigEnv holds an all-reduce worker's Config as JSON.
	ConfigEnv = "TFDIST_ALLREDUCEBENCH_CONFIG"
	// AddrEnv is the address a TCP sender connects to.
	AddrEnv = "TFDIST_ALLREDUCEBENCH_ADDR"
	// BytesEnv is how many bytes a TCP sender writes.
	BytesEnv = "TFDIST_ALLREDUCEBENCH_BYTES"
)

// The roles RoleEnv names.
const (
	RoleAllReduce = "allreduce" // an all-reduce worker: see Worker
	RoleTCPSend   = "tcpsend"   // a TCP sender: see TCPSend
)

// Backend is the collective implementation the workers all-reduce with.
type Backend string

// The backends.
const (
	// Tfdist is tfdist's own collective engine (multiworker.Engine).
	Tfdist Backend = "tfdist"
	// TensorFlow is TensorFlow's ring all-reduce over gRPC
	// (multiworker.Ring).
	TensorFlow Backend = "tensorflow"
)

// Backends lists the backends in the order benchmarks report them.
var Backends = []Backend{Tfdist, TensorFlow}

// ParseBackend returns the backend named s: "tfdist" or "tensorflow".
func ParseBackend(s string) (Backend, error) {
	for _, b := range Backends {
		if s == string(b) {
			return b, nil
		}
	}
	return "", fmt.Errorf("unknown backend %q: expected tfdist or tensorflow", s)
}

// Communication returns the multiworker.Communication that runs b.
func (b Backend) Communication() (multiworker.Communication, error) {
	switch b {
	case Tfdist:
		return multiworker.Engine, nil
	case TensorFlow:
		return multiworker.Ring, nil
	}
	return 0, fmt.Errorf("unknown backend %q: expected tfdist or tensorflow", string(b))
}

// Config is what every all-reduce worker of a measurement does.
type Config struct {
	Backend Backend `json:"backend"`
	// TLS runs the workers' traffic over mutual TLS, with certificates
	// AllReduce makes for the measurement (tfdist's engine only).
	TLS bool `json:"tls,omitempty"`
	// TCP keeps the engine's traffic between workers on this host on
	// loopback TCP instead of shared memory (tfdist's engine only).
	TCP bool `json:"tcp,omitempty"`
	// Sizes are the bytes of float32 all-reduced, in turn; each is a
	// positive multiple of 4.
	Sizes []int64 `json:"sizes"`
	// Iters is how many all-reduces of each size are timed; 0 means
	// enough to move 1 GiB (see itersFor).
	Iters int `json:"iters"`
	// Warmup is how many all-reduces of each size run before the timed
	// ones; 0 means DefaultWarmup.
	Warmup int `json:"warmup"`
	// Model, when set, measures overlap instead of Sizes: the layer sizes
	// of an MLP whose training step on Batch examples per worker is timed
	// as compute alone, its gradients' all-reduce alone and the whole
	// distributed step, with gradients in packs of BytesPerPack bytes.
	Model        []int `json:"model,omitempty"`
	Batch        int   `json:"batch,omitempty"`
	BytesPerPack int64 `json:"bytes_per_pack,omitempty"`
	// Compression, when set (fp16, bf16 or int8, as multiworker.ParseCompression
	// reads them), sends the all-reduced floats over the wire compressed:
	// they are all-reduced as gradients, the only tensors compressed.
	Compression string `json:"compression,omitempty"`
	// ZeRO, with Model, shards the optimizer state at that stage
	// (multiworker.WithZeRO); Adam trains with Adam rather than SGD.
	ZeRO int  `json:"zero,omitempty"`
	Adam bool `json:"adam,omitempty"`
}

// compression returns c's compression.
func (c Config) compression() (multiworker.Compression, error) {
	comp, err := multiworker.ParseCompression(c.Compression)
	if err == nil && comp != multiworker.None && comp != multiworker.FP16 && comp != multiworker.BF16 && comp != multiworker.INT8 {
		err = fmt.Errorf("compression %s: expected fp16, bf16 or int8, which compress every all-reduce alike", comp)
	}
	return comp, err
}

// DefaultWarmup is the warm-up all-reduces of each size when a Config sets
// none.
const DefaultWarmup = 5

// itersFor is how many timed all-reduces of size bytes a Config with no
// Iters runs: enough to move 1 GiB, at least 10 and at most 1,000, so that
// a small size is timed over long enough for the machine's scheduling
// noise to average out (1,000 runs of 1 MiB) and a large one stays short
// (16 runs of 64 MiB), as OSU's micro-benchmarks run more iterations of
// small messages.
func itersFor(size int64) int {
	return int(min(max((1<<30)/size, 10), 1000))
}

// iters is how many timed all-reduces of size bytes c runs.
func (c Config) iters(size int64) int {
	if c.Iters > 0 {
		return c.Iters
	}
	return itersFor(size)
}

// Check reports what is wrong with c, if anything.
func (c Config) Check() error {
	if _, err := c.Backend.Communication(); err != nil {
		return err
	}
	if c.TLS && c.Backend != Tfdist {
		return fmt.Errorf("backend %s with TLS: only tfdist's engine can use TLS", c.Backend)
	}
	if c.TCP && c.Backend != Tfdist {
		return fmt.Errorf("backend %s with TCP only: TensorFlow's collectives always use gRPC over TCP", c.Backend)
	}
	if comp, err := c.compression(); err != nil {
		return err
	} else if comp != multiworker.None && c.Backend != Tfdist {
		return fmt.Errorf("backend %s with compression %s: only tfdist's engine compresses", c.Backend, comp)
	}
	if (c.ZeRO != 0 || c.Adam) && (c.Backend != Tfdist || len(c.Model) == 0) {
		return fmt.Errorf("backend %s, model %v, ZeRO %d, Adam %v: ZeRO and Adam train a model on tfdist's engine", c.Backend, c.Model, c.ZeRO, c.Adam)
	}
	if len(c.Model) > 0 {
		if len(c.Model) < 2 || slices.Min(c.Model) < 1 || c.Batch < 1 || c.BytesPerPack < 0 {
			return fmt.Errorf("model %v, batch %d, bytes per pack %d: expected two or more positive layer sizes, a positive batch and bytes per pack ≥ 0",
				c.Model, c.Batch, c.BytesPerPack)
		}
	} else if len(c.Sizes) == 0 {
		return errors.New("no sizes: expected at least one")
	}
	for _, n := range c.Sizes {
		if n <= 0 || n%4 != 0 {
			return fmt.Errorf("size %d bytes: expected a positive multiple of 4 (float32 elements)", n)
		}
	}
	if c.Iters < 0 {
		return fmt.Errorf("%d iterations: expected 0 (by size) or more", c.Iters)
	}
	if c.Warmup < 0 {
		return fmt.Errorf("%d warm-ups: expected 0 or more", c.Warmup)
	}
	return nil
}

// Timing is one size's time per all-reduce, as worker 0 prints it.
type Timing struct {
	Label   string  `json:"label,omitempty"` // an overlap measurement's part
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`        // per all-reduce
	Runs    int     `json:"runs,omitempty"` // timed all-reduces
}

// AlgBW is the algorithm bandwidth: bytes all-reduced per second.
func (t Timing) AlgBW() float64 { return float64(t.Bytes) / t.Seconds }

// BusBW is the bus bandwidth of an all-reduce between n workers: the
// algorithm bandwidth times 2(n-1)/n, the share of the data each worker
// sends and receives in a ring all-reduce, so that it compares with a link's
// bandwidth whatever n is.
func (t Timing) BusBW(n int) float64 { return t.AlgBW() * 2 * float64(n-1) / float64(n) }

// RunRole plays the role RoleEnv names and returns the process's exit
// status and true; without RoleEnv it returns false and does nothing. An
// all-reduce worker prints worker 0's timings to stdout as one JSON line;
// failures go to stderr.
func RunRole() (int, bool) {
	role, ok := os.LookupEnv(RoleEnv)
	if !ok {
		return 0, false
	}
	var err error
	switch role {
	case RoleAllReduce:
		var c Config
		if err = json.Unmarshal([]byte(os.Getenv(ConfigEnv)), &c); err != nil {
			err = fmt.Errorf("%s: %w", ConfigEnv, err)
			break
		}
		err = Worker(context.Background(), c, os.Stdout)
	case RoleTCPSend:
		var n int64
		if n, err = strconv.ParseInt(os.Getenv(BytesEnv), 10, 64); err != nil {
			err = fmt.Errorf("%s: %w", BytesEnv, err)
			break
		}
		err = TCPSend(context.Background(), os.Getenv(AddrEnv), n)
	default:
		err = fmt.Errorf("%s=%q: expected %s or %s", RoleEnv, role, RoleAllReduce, RoleTCPSend)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "allreducebench %s: %v\n", role, err)
		return 1, true
	}
	return 0, true
}

// Worker joins the cluster TF_CONFIG describes as a MultiWorkerMirrored
// worker with c's backend and, for every size of c in turn, all-reduces
// (sums) a float32 variable of that size with the other workers: c.Warmup
// times, then c.iters(size) times timed. The variable holds this worker's
// Input, and every all-reduce's result is checked against ExpectedSum
// outside the timed runs; a wrong sum is an error naming the worker, the
// size and the element. Worker 0 writes the timings to out as one JSON line,
// [{"bytes":…,"seconds":…},…]; the others write nothing.
func Worker(ctx context.Context, c Config, out io.Writer) error {
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if err := c.Check(); err != nil {
		return err
	}
	comm, _ := c.Backend.Communication()
	comp, _ := c.compression()
	opts := []multiworker.Option{multiworker.WithCommunication(comm), multiworker.WithBytesPerPack(c.BytesPerPack),
		multiworker.WithStartupTimeout(60 * time.Second), multiworker.WithSharedMemory(!c.TCP), multiworker.WithCompression(comp)}
	if c.ZeRO != 0 {
		opts = append(opts, multiworker.WithZeRO(c.ZeRO))
	}
	s, err := multiworker.New(ctx, opts...)
	if err != nil {
		return err
	}
	measure := allReduces
	if len(c.Model) > 0 {
		measure = overlap
	}
	timings, err := measure(ctx, s, c)
	if cerr := s.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing the strategy: %w", cerr)
	}
	if err != nil {
		return err
	}
	if s.WorkerID() != 0 {
		return nil
	}
	line, err := json.Marshal(timings)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", line)
	return err
}

// allReduces times, for each size of c, the all-reduce of a float32
// variable that holds Input's values of this worker in its copies, and
// checks every all-reduce's result against ExpectedSum outside the timed
// region: the one element each warm-up and timed run fetches, and then every
// element of one more all-reduce of the same variable, which also shows that
// the runs left the variable as it was.
func allReduces(ctx context.Context, s *multiworker.Strategy, c Config) ([]Timing, error) {
	dummy, err := tf.NewTensor(float32(0))
	if err != nil {
		return nil, err
	}
	feeds := []map[string]*tf.Tensor{{"dummy": dummy}}
	worker, workers := s.WorkerID(), s.NumWorkers()
	local := s.NumReplicasInSync() / workers
	tol := tolerance(c, workers*local)
	var out []Timing
	for i, size := range c.Sizes {
		fail := func(err error) ([]Timing, error) {
			return nil, fmt.Errorf("worker %d, %s: %w", worker, FormatSize(size), err)
		}
		var v strategy.Variable
		if err := s.Scope(func(sc strategy.Scope) error {
			var err error
			v, err = sc.Variable(fmt.Sprintf("x%d_%d", i, size), tf.Float, []int64{size / 4}, strategy.Zeros())
			return err
		}); err != nil {
			return fail(err)
		}
		steps, err := buildSteps(s, v, c.Compression != "")
		if err != nil {
			return fail(err)
		}
		// Each worker writes its own values to its copies (every worker
		// at once, since the first write initialises the variable with a
		// broadcast from worker 0).
		x, err := tf.NewTensor(Input(worker, int(size/4)))
		if err != nil {
			return fail(err)
		}
		if err := s.Assign(ctx, v, x); err != nil {
			return fail(fmt.Errorf("writing the input: %w", err))
		}
		for range c.Warmup {
			res, err := s.RunReplicas(ctx, steps.timed, feeds, 1)
			if err != nil {
				return fail(fmt.Errorf("warm-up: %w", err))
			}
			if err := checkFirst(res, workers, local); err != nil {
				return fail(fmt.Errorf("warm-up: %w", err))
			}
		}
		n := c.iters(size)
		results := make([]strategy.Result, n)
		start := time.Now()
		for k := range n {
			if results[k], err = s.RunReplicas(ctx, steps.timed, feeds, 1); err != nil {
				return fail(err)
			}
		}
		elapsed := time.Since(start)
		for k, res := range results {
			if err := checkFirst(res, workers, local); err != nil {
				return fail(fmt.Errorf("timed run %d: %w", k, err))
			}
		}
		sum, err := steps.sum(ctx, s, feeds)
		if err != nil {
			return fail(fmt.Errorf("checking the sum: %w", err))
		}
		if err := checkSum(sum, workers, local, tol); err != nil {
			return fail(fmt.Errorf("after the timed runs: %w", err))
		}
		out = append(out, Timing{Bytes: size, Seconds: elapsed.Seconds() / float64(n), Runs: n})
	}
	return out, nil
}

// Input is worker w's n values to all-reduce: whole numbers from -125 to
// 125 that depend on w and the index, so that an element taken from the
// wrong worker or the wrong position changes the sum, and the sum of any
// number of workers' values up to 2^24/125 is exact in float32 whatever the
// order of its additions.
func Input(w, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = inputAt(w, i)
	}
	return x
}

func inputAt(w, i int) float32 { return float32((i*(2*w+1)+3*w)%251 - 125) }

// ExpectedSum is element i of the sum of Input over workers workers, each
// with local replicas whose copies all hold the worker's Input.
func ExpectedSum(workers, local, i int) float32 {
	var s float32
	for w := range workers {
		s += inputAt(w, i)
	}
	return s * float32(local)
}

// checkFirst checks the first element of a timed step's sum, where it
// returns one.
func checkFirst(res strategy.Result, workers, local int) error {
	first, ok := res["first"]
	if !ok {
		return nil
	}
	return checkSum(first, workers, local, 0)
}

// tolerance is how far an all-reduced sum of replicas replicas' Input may
// be from ExpectedSum: 0, as float32 sums whole numbers exactly; under
// compression, what rounding to the wire's precision at every hop may
// cost (fp16's 11 significant bits hold every such sum of up to 16
// replicas exactly).
func tolerance(c Config, replicas int) float32 {
	const eps = 1.0 / 128 // bfloat16's relative precision, 2^-7
	if c.Compression == "" || c.Compression == "none" {
		return 0
	}
	return eps * 125 * float32(replicas) * float32(replicas)
}

// checkSum checks each local replica's tensor in got, the first elements
// of an all-reduced sum, against ExpectedSum, to within tol. The error
// names the replica, the first element that differs, its value and the
// expected one, and how many elements differ.
func checkSum(got strategy.PerReplica, workers, local int, tol float32) error {
	if len(got) != local {
		return fmt.Errorf("the all-reduce returned %d tensors for %d local replicas", len(got), local)
	}
	for r, t := range got {
		vals := tensorutil.Float32s(t)
		if vals == nil {
			return fmt.Errorf("replica %d: the all-reduce returned %v, not float32 values", r, t.DataType())
		}
		bad, first := 0, -1
		for i, v := range vals {
			if d := v - ExpectedSum(workers, local, i); d > tol || d < -tol {
				if bad++; first < 0 {
					first = i
				}
			}
		}
		if bad > 0 {
			return fmt.Errorf("replica %d: element %d of the all-reduced sum is %v, expected %v (%d of %d elements differ)",
				r, first, vals[first], ExpectedSum(workers, local, first), bad, len(vals))
		}
	}
	return nil
}

// ParseSizes parses a comma-separated list of sizes (see ParseSize).
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := ParseSize(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// ParseSize parses a size of float32 data: plain bytes ("4096") or a whole
// number with a KiB, MiB or GiB suffix ("4KiB", "16MiB"). It must be a
// positive multiple of 4 bytes.
func ParseSize(s string) (int64, error) {
	num, shift := s, uint(0)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, shift = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)>>shift {
		return 0, fmt.Errorf("size %q: expected a positive whole number of bytes, optionally with a KiB, MiB or GiB suffix (e.g. 4096, 4KiB, 16MiB)", s)
	}
	n <<= shift
	if n%4 != 0 {
		return 0, fmt.Errorf("size %q: expected a multiple of 4 bytes (float32 elements)", s)
	}
	return n, nil
}

// FormatSize writes n bytes in the largest binary unit that divides it.
func FormatSize(n int64) string {
	for _, u := range sizeUnits[:3] {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.suffix)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// FormatBandwidth writes bytes per second in MiB/s, or GiB/s from 10 GiB/s,
// with three significant digits or more.
func FormatBandwidth(bps float64) string {
	mib := bps / (1 << 20)
	switch {
	case mib >= 10<<10:
		return fmt.Sprintf("%.1f GiB/s", mib/(1<<10))
	case mib >= 100:
		return fmt.Sprintf("%.0f MiB/s", mib)
	case mib >= 10:
		return fmt.Sprintf("%.1f MiB/s", mib)
	}
	return fmt.Sprintf("%.2f MiB/s", mib)
}
