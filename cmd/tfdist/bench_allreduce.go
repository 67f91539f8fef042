package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/allreducebench"
	"github.com/tfdist/tfdist/internal/emunet"
	"github.com/tfdist/tfdist/mtls"
)

var benchAllReduceCommand = &command{
	name:    "bench allreduce",
	args:    "[flags]",
	summary: "measure the all-reduce bandwidth between worker processes on this machine",
	help: `Bench allreduce starts --workers MultiWorkerMirrored worker processes on
127.0.0.1 (this tfdist binary, re-executed) and times the all-reduce (sum)
of a float32 tensor of each of --sizes between them, after 5 warm-ups:
--iters runs of each size, or by default enough runs to move 1 GiB (at
least 10, at most 1,000), so that a small size's time is averaged over
long enough to be steady on a busy machine. It prints, per size, the
time per all-reduce, the algorithm bandwidth (bytes / time) and the bus
bandwidth (algorithm bandwidth x 2(N-1)/N for N workers, the share of the
data each worker sends and receives in a ring all-reduce, which compares
with a link's bandwidth whatever N is), and for reference what a plain
TCP copy between two processes reaches in the same run. The workers share
this machine's CPUs: compare the ratios, not the absolute numbers,
between machines.

--backend chooses the collectives: tfdist (tfdist's own collective engine,
the default) or tensorflow (TensorFlow's ring all-reduce over gRPC).
tfdist's engine moves the frames of workers on one host through shared
memory once their TCP connection is set up; --tcp keeps them on TCP, as
between machines. --tls runs tfdist's engine over mutual TLS, with
certificates made for the run, and measures the same sizes in plaintext
too, in the same run: the table adds TLS's bus bandwidth as a ratio of
plaintext's (add --tcp, or TLS carries only the handshake).
--sizes takes bytes, or whole numbers with a KiB, MiB or GiB suffix; each a
multiple of 4. With --json, bench allreduce prints only worker 0's timings,
one JSON line: [{"bytes":…,"seconds":…,"runs":…},…], seconds per all-reduce
and the number of timed all-reduces.

The measurement stops after 10 minutes; a worker's failure stops the others
and shows that worker's last output lines.

--link runs each worker on an emulated host of its own (a network
namespace, as root) whose link to the others has the bandwidth, latency,
jitter and loss that RATE[,DELAY[,JITTER[,LOSS]]] gives, e.g. 1gbit,0.2ms
or 100mbit,20ms: the traffic between workers crosses that link instead
of shared memory or loopback, and the table gives the bus bandwidth as a
ratio of the link's rate. --compression fp16, bf16 or int8 sends the
all-reduced floats over the wire in 16 or 8 bits (as multiworker's
WithCompression sends gradients) and measures float32 too, in the same
run: the table adds float32's time per all-reduce and the speed-up.

To measure a network between machines, run 'tfdist bench allreduce --worker'
on every machine, each with the TF_CONFIG of its task (as for training):
each process joins the cluster as one worker, and worker 0 prints the
table (without the TCP reference) or, with --json, its JSON line.

Examples

	tfdist bench allreduce
	tfdist bench allreduce --workers 3 --backend tensorflow
	tfdist bench allreduce --tcp
	tfdist bench allreduce --tls --tcp --sizes 16MiB,64MiB
	tfdist bench allreduce --link 1gbit,0.2ms --compression fp16 --sizes 16MiB,64MiB
	tfdist bench allreduce --sizes 4KiB,1MiB,256MiB --iters 20 --json
	TF_CONFIG='{"cluster":{"worker":["10.0.0.1:2222","10.0.0.2:2222"]},"task":{"type":"worker","index":0}}' tfdist bench allreduce --worker
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		workers := fs.Int("workers", 2, "worker processes, 2 or more")
		backend := fs.String("backend", string(allreducebench.Tfdist), "collectives: tfdist or tensorflow")
		sizes := fs.String("sizes", "1MiB,16MiB,64MiB", "comma-separated sizes to all-reduce: bytes, or with a KiB, MiB or GiB suffix")
		iters := fs.Int("iters", 0, "timed all-reduces of each size; 0: enough to move 1 GiB, from 10 to 1,000")
		jsonOut := fs.Bool("json", false, "print worker 0's timings as one JSON line instead of the table")
		useTLS := fs.Bool("tls", false, "run over mutual TLS and compare with plaintext (tfdist's engine only; with --tcp, since workers on one host otherwise use shared memory)")
		tcpOnly := fs.Bool("tcp", false, "keep the traffic between workers on one host on loopback TCP instead of shared memory (tfdist's engine only)")
		worker := fs.Bool("worker", false, "join the cluster TF_CONFIG describes as one of its workers instead of starting local ones")
		link := fs.String("link", "", "run each worker on an emulated host whose link is `RATE[,DELAY[,JITTER[,LOSS]]]`, e.g. 1gbit,0.2ms (as root)")
		compression := fs.String("compression", "", "send the all-reduced floats as `fp16`, bf16 or int8, and compare with float32 in the same run (tfdist's engine only)")
		return func(e *env, args []string) int {
			usage := func(format string, a ...any) int {
				fmt.Fprintf(e.stderr, "tfdist bench allreduce: "+format+"\nRun 'tfdist bench allreduce -h' for help.\n", a...)
				return exitUsage
			}
			if len(args) > 0 {
				return usage("unexpected arguments %q", args)
			}
			if *worker && flagSet(fs, "workers") {
				return usage("--workers %d with --worker: the cluster in TF_CONFIG says how many workers there are", *workers)
			}
			if *workers < 2 {
				return usage("--workers %d: expected 2 or more worker processes", *workers)
			}
			b, err := allreducebench.ParseBackend(*backend)
			if err != nil {
				return usage("--backend %q: expected tfdist or tensorflow", *backend)
			}
			if *useTLS && b != allreducebench.Tfdist {
				return usage("--tls with --backend %s: only tfdist's engine can use TLS", b)
			}
			if *tcpOnly && b != allreducebench.Tfdist {
				return usage("--tcp with --backend %s: TensorFlow's collectives always use gRPC over TCP", b)
			}
			if *useTLS && *worker {
				return usage("--tls with --worker: a worker takes its certificates from the environment (%s, %s, %s)", mtls.EnvCA, mtls.EnvCert, mtls.EnvKey)
			}
			if *compression == "none" {
				*compression = ""
			}
			if *useTLS && *compression != "" {
				return usage("--tls with --compression: each compares with a run without it; give one")
			}
			var l *emunet.Link
			if *link != "" {
				if *worker {
					return usage("--link with --worker: a worker of TF_CONFIG's cluster runs where it is started")
				}
				parsed, err := emunet.ParseLink(*link)
				if err != nil {
					return usage("--link: %v", err)
				}
				l = &parsed
			}
			sz, err := allreducebench.ParseSizes(*sizes)
			if err != nil {
				return usage("--sizes %q: %v", *sizes, err)
			}
			if *iters < 0 {
				return usage("--iters %d: expected 0 (by size) or more", *iters)
			}
			c := allreducebench.Config{Backend: b, TLS: *useTLS, TCP: *tcpOnly, Sizes: sz, Iters: *iters, Warmup: allreducebench.DefaultWarmup,
				Compression: *compression}
			if err := c.Check(); err != nil {
				return usage("%v", err)
			}
			if *worker {
				err = benchAllReduceAsWorker(e.stdout, c, *jsonOut)
			} else {
				err = benchAllReduce(e.stdout, *workers, c, l, *jsonOut)
			}
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist bench allreduce: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

// benchAllReduceTimeout bounds a whole bench allreduce run.
const benchAllReduceTimeout = 10 * time.Minute

// benchAllReduceContext ends at an interrupt or after benchAllReduceTimeout.
func benchAllReduceContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, benchAllReduceTimeout)
	return ctx, func() { cancel(); stop() }
}

var backendDescriptions = map[allreducebench.Backend]string{
	allreducebench.Tfdist:     "tfdist's collective engine",
	allreducebench.TensorFlow: "TensorFlow's ring all-reduce over gRPC",
}

// benchAllReduce runs c between workers processes of this executable, on
// emulated hosts joined by links l if l is not nil, and writes the table,
// or with jsonOut worker 0's JSON line, to out.
func benchAllReduce(out io.Writer, workers int, c allreducebench.Config, l *emunet.Link, jsonOut bool) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable to start the workers: %w", err)
	}
	x := allreducebench.Exec{Path: self}
	if l != nil {
		if x.Net, err = emunet.New(workers, *l); err != nil {
			return err
		}
		defer x.Net.Close()
	}
	ctx, cancel := benchAllReduceContext()
	defer cancel()

	res, err := allreducebench.AllReduce(ctx, x, workers, c)
	if err != nil {
		return err
	}
	if jsonOut {
		_, err := fmt.Fprintln(out, res.Line)
		return err
	}
	t := table{workers: workers, c: c, timings: res.Timings}
	if c.TLS || c.Compression != "" {
		rc := c
		rc.TLS, rc.Compression = false, ""
		ref, err := allreducebench.AllReduce(ctx, x, workers, rc)
		if err != nil {
			return fmt.Errorf("reference without %s: %w", t.compared(), err)
		}
		t.reference = ref.Timings
	}
	if l != nil {
		t.rate, t.rateName = float64(l.Rate)/8, "link"
		fmt.Fprintf(out, "all-reduce (sum) of float32 between %d worker processes on emulated hosts, each host's link %s\n", workers, l)
		return t.write(out)
	}
	if t.rate, err = allreducebench.TCPBandwidth(ctx, x, allreducebench.TCPBytes); err != nil {
		return err
	}
	t.rateName = "tcp"
	fmt.Fprintf(out, "all-reduce (sum) of float32 between %d worker processes on 127.0.0.1\n", workers)
	if err := t.write(out); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "\nplain TCP copy of %s between two processes: %s\n",
		allreducebench.FormatSize(allreducebench.TCPBytes), allreducebench.FormatBandwidth(t.rate))
	return err
}

// benchAllReduceAsWorker runs c as one worker of the cluster TF_CONFIG
// describes; worker 0 writes the table, or with jsonOut its JSON line.
func benchAllReduceAsWorker(out io.Writer, c allreducebench.Config, jsonOut bool) error {
	r, err := cluster.FromEnv()
	if err != nil {
		return err
	}
	workers := r.ClusterSpec().WorkerCount()
	if workers < 2 {
		return fmt.Errorf("--worker: TF_CONFIG's cluster has %d workers; expected a TF_CONFIG naming 2 or more chief and worker tasks", workers)
	}
	ctx, cancel := benchAllReduceContext()
	defer cancel()
	var line bytes.Buffer
	if err := allreducebench.Worker(ctx, c, &line); err != nil {
		return err
	}
	if line.Len() == 0 || jsonOut { // another worker prints nothing
		_, err := out.Write(line.Bytes())
		return err
	}
	var ts []allreducebench.Timing
	if err := json.Unmarshal(line.Bytes(), &ts); err != nil {
		return fmt.Errorf("worker 0's timings: %w", err)
	}
	fmt.Fprintf(out, "all-reduce (sum) of float32 between the %d workers of TF_CONFIG's cluster\n", workers)
	return table{workers: workers, c: c, timings: ts}.write(out)
}

// table is what bench allreduce prints: the timings between workers;
// their bus bandwidth's ratio to a reference rate, rateName's, if any; and
// the timings of the same sizes without TLS or compression, measured in
// the same run, with their ratio.
type table struct {
	workers   int
	c         allreducebench.Config
	timings   []allreducebench.Timing
	rate      float64 // bytes per second, 0: none
	rateName  string
	reference []allreducebench.Timing
}

// compared names what the reference runs without.
func (t table) compared() string {
	if t.c.TLS {
		return "TLS"
	}
	return "compression"
}

// write writes the backend line and the table.
func (t table) write(out io.Writer) error {
	c := t.c
	security := ""
	if c.TLS {
		security = " over mutual TLS"
	}
	if c.Compression != "" {
		security += ", the floats sent as " + c.Compression
	}
	if c.Backend == allreducebench.Tfdist && !c.TCP && t.rateName != "link" {
		security += ", shared memory between workers on one host"
	}
	fmt.Fprintf(out, "backend %s (%s)%s, timed runs of each size after %d warm-ups\n\n", c.Backend, backendDescriptions[c.Backend], security, c.Warmup)
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	head := "size\truns\ttime/all-reduce\talgbw\tbusbw"
	if t.rate > 0 {
		head += "\tbusbw/" + t.rateName
	}
	switch {
	case t.reference != nil && c.TLS:
		head += "\tplaintext busbw\ttls/plaintext"
	case t.reference != nil:
		head += "\tfloat32 time\tspeed-up"
	}
	fmt.Fprintln(tw, head)
	for i, x := range t.timings {
		bus := x.BusBW(t.workers)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s", allreducebench.FormatSize(x.Bytes), x.Runs, formatSeconds(x.Seconds),
			allreducebench.FormatBandwidth(x.AlgBW()), allreducebench.FormatBandwidth(bus))
		if t.rate > 0 {
			fmt.Fprintf(tw, "\t%.3f", bus/t.rate)
		}
		switch ref := t.reference; {
		case ref != nil && c.TLS:
			fmt.Fprintf(tw, "\t%s\t%.3f", allreducebench.FormatBandwidth(ref[i].BusBW(t.workers)), bus/ref[i].BusBW(t.workers))
		case ref != nil:
			fmt.Fprintf(tw, "\t%s\t%.3f", formatSeconds(ref[i].Seconds), ref[i].Seconds/x.Seconds)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// formatSeconds writes s seconds in µs, ms or s with three significant
// digits or more.
func formatSeconds(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.1f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.3f s", s)
}
