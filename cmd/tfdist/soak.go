package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/cmd/tfdist/internal/soak"
)

var soakCommand = &command{
	name:    "soak",
	args:    "[flags]",
	summary: "train for a long time under each strategy and check that no process grows",
	help: `Soak trains the digits classifier (the internal/cmd/digits program,
tfdist's test bed) for many steps under each strategy, one after the
other, as a job that runs for hours does: the default strategy, Mirrored
on 2 logical CPUs, MultiWorkerMirrored on 2 workers of 2 logical CPUs
each (on tfdist's collective engine, and on TensorFlow's collectives for
at most 10,000 steps), and parameter-server training with a chief, 2
workers and 1 ps task; "-strategies robust,topk,wide,pushed" soaks the
engine's gradient paths too (3 workers under -aggregation
trimmed_mean(1); 2 workers of 2 logical CPUs under -compression
topk(0.01); 2 workers of 2 logical CPUs with -hidden 1024, whose
all-reduce reads its chunks from the other worker's memory, and with
-hidden 16384, whose first layer's gradient the workers write into each
other's results); "-strategies elastic" runs an elastic job (launch
--elastic, 2 to 3 workers) whose membership changes every second, one
worker fewer then one more, and judges the workers that lived through
the run, not the step times. Every -interval it samples each process's OS threads,
resident memory and open file descriptors (from /proc, so Linux only),
and the goroutines the program reports. It prints a table per strategy
and fails when a process exits with an error or breaks a bound:

	OS threads         at most -max-threads at any time
	resident memory    at the end, at most -max-rss-growth above its value
	                   at a tenth of the run
	file descriptors   at the end, at most -max-fd-growth more than at a
	                   tenth of the run
	goroutines         likewise, at most -max-goroutine-growth more
	step time          no training step, after each worker's first, slower
	                   than -max-step-ratio times the median step (under
	                   ps, a step lasts from the start of its first run on
	                   a worker to the end of its last); it catches stalls,
	                   and on a machine whose scheduler holds a thread back
	                   for several steps' time, that too

'make soak' builds that program and runs this with the defaults.

Exit status: 0 when every run passed, 1 when one failed, 2 for bad flags.

Examples

	go build -o digits ./internal/cmd/digits
	tfdist soak -digits ./digits
	tfdist soak -digits ./digits -strategies multiworker -steps 200000 -v
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		bin := fs.String("digits", "", "the internal/cmd/digits binary `PATH` (default: digits next to tfdist, else on PATH)")
		steps := fs.Int("steps", 50000, "training steps of each run")
		strategies := fs.String("strategies", "default,mirrored,multiworker,multiworker-tensorflow,ps", "the `LIST` of setups to run, comma-separated")
		interval := fs.Duration("interval", time.Second, "time between samples")
		timeout := fs.Duration("timeout", 2*time.Hour, "bound on each run")
		maxThreads := fs.Int("max-threads", soak.DefaultBounds.MaxThreads, "OS threads a process may hold")
		rssGrowth := fs.Float64("max-rss-growth", soak.DefaultBounds.MaxRSSGrowth, "growth of resident memory allowed from a tenth of the run to its end, as a fraction")
		fdGrowth := fs.Int("max-fd-growth", soak.DefaultBounds.MaxFDGrowth, "open file descriptors a process may gain from a tenth of the run to its end")
		gGrowth := fs.Int("max-goroutine-growth", soak.DefaultBounds.MaxGoroutineGrowth, "goroutines a process may gain from a tenth of the run to its end")
		stepRatio := fs.Float64("max-step-ratio", soak.DefaultBounds.MaxStepRatio, "the slowest step allowed, as a multiple of the median step (0: unbounded)")
		verbose := fs.Bool("v", false, "show every task's output and the launcher's events")
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "soak", args); !ok {
				return code
			}
			var setups []soak.Setup
			for _, name := range strings.Split(*strategies, ",") {
				s, err := soak.Lookup(strings.TrimSpace(name))
				if err != nil {
					fmt.Fprintf(e.stderr, "tfdist soak: -strategies: %v\n", err)
					return exitUsage
				}
				setups = append(setups, s)
			}
			for _, c := range []struct {
				bad  bool
				flag string
				val  any
				want string
			}{
				{*steps < 1, "steps", *steps, "at least 1"},
				{*interval <= 0, "interval", *interval, "a positive duration"},
				{*timeout <= 0, "timeout", *timeout, "a positive duration"},
				{*maxThreads < 1, "max-threads", *maxThreads, "at least 1"},
				{*rssGrowth < 0, "max-rss-growth", *rssGrowth, "0 or more"},
				{*fdGrowth < 0, "max-fd-growth", *fdGrowth, "0 or more"},
				{*gGrowth < 0, "max-goroutine-growth", *gGrowth, "0 or more"},
				{*stepRatio < 0, "max-step-ratio", *stepRatio, "0 or more"},
			} {
				if c.bad {
					fmt.Fprintf(e.stderr, "tfdist soak: -%s %v: expected %s\n", c.flag, c.val, c.want)
					return exitUsage
				}
			}
			path, err := digitsBinary(*bin)
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist soak: %v\n", err)
				return exitUsage
			}
			o := soak.Options{Classifier: path, Steps: *steps, Interval: *interval, Timeout: *timeout,
				Bounds: soak.Bounds{MaxThreads: *maxThreads, MaxRSSGrowth: *rssGrowth, MaxFDGrowth: *fdGrowth, MaxGoroutineGrowth: *gGrowth, MaxStepRatio: *stepRatio}}
			if *verbose {
				o.Output, o.Logger = e.stderr, cliLogger(e, zapcore.InfoLevel, "soak")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			code := exitOK
			for _, s := range setups {
				fmt.Fprintf(e.stderr, "tfdist soak: %s, %d steps...\n", s.Name, s.StepsOf(*steps))
				r, err := soak.Run(ctx, s, o)
				if err != nil {
					fmt.Fprintf(e.stderr, "tfdist soak: %v\n", err)
					return exitFail
				}
				r.WriteTable(e.stdout)
				fmt.Fprintln(e.stdout)
				if r.Failed() {
					code = exitFail
				}
				if ctx.Err() != nil {
					return exitFail
				}
			}
			return code
		}
	},
}

// digitsBinary finds the internal/cmd/digits program: the path given,
// else a "digits" beside this executable, else one on PATH.
func digitsBinary(given string) (string, error) {
	if given != "" {
		if _, err := os.Stat(given); err != nil {
			return "", fmt.Errorf("-digits %s: %w", given, err)
		}
		return given, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "digits")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("digits")
	if err != nil {
		return "", fmt.Errorf("-digits not given and no digits program beside tfdist or on PATH; build one with: go build -o digits ./internal/cmd/digits")
	}
	return p, nil
}
