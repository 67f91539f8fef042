package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/tfdist/tfdist/internal/classifier"
)

var benchCommand = &command{
	name:    "bench",
	args:    "[flags]",
	summary: "measure the classifier's training speed under each strategy on this machine",
	help: `Bench trains the digits classifier for the same steps and global batch
under the default strategy, Mirrored on 1, 2 and 4 logical CPUs, and
MultiWorkerMirrored in one process, one after the other in this run, and
prints each one's examples/s and its speed relative to the default
strategy. Machines are noisy: compare the ratios, and repeat with -rounds.

For the all-reduce bandwidth between worker processes, run
'tfdist bench allreduce' (see 'tfdist help bench allreduce'); for the step
benchmarks against a hand-written graft loop and the rest, 'make bench'.

Examples

	tfdist bench
	tfdist bench -steps 500 -global-batch 256 -rounds 3
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		steps := fs.Int("steps", 300, "training steps per run")
		batch := fs.Int("global-batch", 128, "examples per step across all replicas")
		rounds := fs.Int("rounds", 1, "runs of every configuration; the best of them is reported")
		return func(e *env, args []string) int {
			if len(args) > 0 {
				fmt.Fprintf(e.stderr, "tfdist bench: unexpected arguments %q (the one subcommand is 'tfdist bench allreduce')\n", args)
				return exitUsage
			}
			if *steps < 1 || *batch < 4 || *batch%4 != 0 || *rounds < 1 {
				fmt.Fprintf(e.stderr, "tfdist bench: -steps %d, -global-batch %d, -rounds %d: expected steps ≥ 1, a global batch divisible by 4, rounds ≥ 1\n", *steps, *batch, *rounds)
				return exitUsage
			}
			if err := bench(context.Background(), e.stdout, *steps, *batch, *rounds); err != nil {
				fmt.Fprintf(e.stderr, "tfdist bench: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

type benchConfig struct {
	label    string
	strategy string
	devices  int
}

var benchConfigs = []benchConfig{
	{"default", "default", 1},
	{"mirrored, 1 device", "mirrored", 1},
	{"mirrored, 2 devices", "mirrored", 2},
	{"mirrored, 4 devices", "mirrored", 4},
	{"multiworker, 1 process, 2 devices", "multiworker", 2},
}

func bench(ctx context.Context, out io.Writer, steps, batch, rounds int) error {
	best := make([]float64, len(benchConfigs))
	for range rounds {
		for i, c := range benchConfigs {
			o, err := classifier.ParseFlags([]string{"-strategy", c.strategy, "-devices", fmt.Sprint(c.devices),
				"-steps", fmt.Sprint(steps), "-global-batch", fmt.Sprint(batch), "-log-every", "0"}, io.Discard)
			if err != nil {
				return err
			}
			res, err := classifier.Run(ctx, o, io.Discard)
			if err != nil {
				return fmt.Errorf("%s: %w", c.label, err)
			}
			best[i] = max(best[i], res.ExamplesPerSec)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "strategy\texamples/s\tsteps/s\tvs default\n")
	for i, c := range benchConfigs {
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.2f\n", c.label, best[i], best[i]/float64(batch), best[i]/best[0])
	}
	return tw.Flush()
}
