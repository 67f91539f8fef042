package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tfdist/tfdist/internal/allreducebench"
)

var benchAllReduceCommand = &command{
	name:    "bench allreduce",
	args:    "[flags]",
	summary: "measure the all-reduce bandwidth between worker processes on this machine",
	help: `Bench allreduce starts --workers MultiWorkerMirrored worker processes on
127.0.0.1 (this tfdist binary, re-executed) and times the all-reduce (sum)
of a float32 tensor of each of --sizes between them: --iters runs of each
size after 2 warm-ups. It prints, per size, the time per all-reduce, the
algorithm bandwidth (bytes / time) and the bus bandwidth (algorithm
bandwidth x 2(N-1)/N for N workers, the share of the data each worker sends
and receives in a ring all-reduce, which compares with a link's bandwidth
whatever N is), and for reference what a plain TCP copy between two
processes reaches in the same run. The workers share this machine's CPUs:
compare the ratios, not the absolute numbers, between machines.

--backend chooses the collectives: tfdist (tfdist's own collective engine,
the default) or tensorflow (TensorFlow's ring all-reduce over gRPC).
--sizes takes bytes, or whole numbers with a KiB, MiB or GiB suffix; each a
multiple of 4. With --json, bench allreduce prints only worker 0's timings,
one JSON line: [{"bytes":…,"seconds":…},…], seconds per all-reduce.

The measurement stops after 10 minutes; a worker's failure stops the others
and shows that worker's last output lines.

Examples

	tfdist bench allreduce
	tfdist bench allreduce --workers 3 --backend tensorflow
	tfdist bench allreduce --sizes 4KiB,1MiB,256MiB --iters 20 --json
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		workers := fs.Int("workers", 2, "worker processes, 2 or more")
		backend := fs.String("backend", string(allreducebench.Tfdist), "collectives: tfdist or tensorflow")
		sizes := fs.String("sizes", "1MiB,16MiB,64MiB", "comma-separated sizes to all-reduce: bytes, or with a KiB, MiB or GiB suffix")
		iters := fs.Int("iters", 10, "timed all-reduces of each size")
		jsonOut := fs.Bool("json", false, "print worker 0's timings as one JSON line instead of the table")
		return func(e *env, args []string) int {
			usage := func(format string, a ...any) int {
				fmt.Fprintf(e.stderr, "tfdist bench allreduce: "+format+"\nRun 'tfdist bench allreduce -h' for help.\n", a...)
				return exitUsage
			}
			if len(args) > 0 {
				return usage("unexpected arguments %q", args)
			}
			if *workers < 2 {
				return usage("--workers %d: expected 2 or more worker processes", *workers)
			}
			b, err := allreducebench.ParseBackend(*backend)
			if err != nil {
				return usage("--backend %q: expected tfdist or tensorflow", *backend)
			}
			sz, err := allreducebench.ParseSizes(*sizes)
			if err != nil {
				return usage("--sizes %q: %v", *sizes, err)
			}
			if *iters < 1 {
				return usage("--iters %d: expected 1 or more", *iters)
			}
			c := allreducebench.Config{Backend: b, Sizes: sz, Iters: *iters, Warmup: allreducebench.DefaultWarmup}
			if err := benchAllReduce(e.stdout, *workers, c, *jsonOut); err != nil {
				fmt.Fprintf(e.stderr, "tfdist bench allreduce: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

// benchAllReduceTimeout bounds a whole bench allreduce run.
const benchAllReduceTimeout = 10 * time.Minute

var backendDescriptions = map[allreducebench.Backend]string{
	allreducebench.Tfdist:     "tfdist's collective engine",
	allreducebench.TensorFlow: "TensorFlow's ring all-reduce over gRPC",
}

// benchAllReduce runs c between workers processes of this executable and
// writes the table, or with jsonOut worker 0's JSON line, to out.
func benchAllReduce(out io.Writer, workers int, c allreducebench.Config, jsonOut bool) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable to start the workers: %w", err)
	}
	x := allreducebench.Exec{Path: self}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, benchAllReduceTimeout)
	defer cancel()

	res, err := allreducebench.AllReduce(ctx, x, workers, c)
	if err != nil {
		return err
	}
	if jsonOut {
		_, err := fmt.Fprintln(out, res.Line)
		return err
	}
	tcp, err := allreducebench.TCPBandwidth(ctx, x, allreducebench.TCPBytes)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "all-reduce (sum) of float32 between %d worker processes on 127.0.0.1\n", workers)
	fmt.Fprintf(out, "backend %s (%s), %d timed runs per size after %d warm-ups\n\n", c.Backend, backendDescriptions[c.Backend], c.Iters, c.Warmup)
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintf(tw, "size\ttime/all-reduce\talgbw\tbusbw\tbusbw/tcp\n")
	for _, t := range res.Timings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\n", allreducebench.FormatSize(t.Bytes), formatSeconds(t.Seconds),
			allreducebench.FormatBandwidth(t.AlgBW()), allreducebench.FormatBandwidth(t.BusBW(workers)), t.BusBW(workers)/tcp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "\nplain TCP copy of %s between two processes: %s\n",
		allreducebench.FormatSize(allreducebench.TCPBytes), allreducebench.FormatBandwidth(tcp))
	return err
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
