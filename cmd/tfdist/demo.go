package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tfdist/tfdist/internal/classifier"
	"github.com/tfdist/tfdist/paramserver"
)

var demoCommand = &command{
	name:    "demo",
	args:    "[flags]",
	summary: "train the digits classifier (Mirrored, 2 logical CPUs by default)",
	help: `Demo trains a multi-layer perceptron on the UCI handwritten digits that
ship with tfdist, prints falling loss, and reports the held-out accuracy
(90% or more with the defaults). It is the program of internal/cmd/digits,
tfdist's test bed, in the tfdist command: every flag of that program works
here. examples/classifier trains the same MLP with the public API alone
(train.Fit), as a program to copy; 'make demo' runs it.

By default it uses the Mirrored strategy on 2 logical CPU devices. Give
-strategy default to compare with one device: with the same seed, global
batch and steps, the final loss and parameters agree up to float summation
order. Under 'tfdist launch', -strategy multiworker trains across the
launched processes.

Examples

	tfdist demo
	tfdist demo -strategy default -steps 200 -json
	tfdist launch --workers 2 -- tfdist demo -strategy multiworker -devices 2
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		var o classifier.Options
		classifier.RegisterFlags(fs, &o)
		fs.Lookup("strategy").DefValue = "mirrored"
		fs.Lookup("devices").DefValue = "2"
		o.Strategy, o.Devices = "mirrored", 2
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "demo", args); !ok {
				return code
			}
			if err := o.Check(); err != nil {
				fmt.Fprintf(e.stderr, "tfdist demo: %v\n", err)
				return exitUsage
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			fmt.Fprintf(e.stderr, "tfdist demo: %s strategy, %d device(s) per process, global batch %d, %d steps\n",
				o.Strategy, o.Devices, o.GlobalBatch, o.Steps)
			res, err := classifier.Run(ctx, o, e.stdout)
			if errors.Is(err, paramserver.ErrNotChief) {
				return exitOK
			}
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist demo: %v\n", err)
				return exitFail
			}
			fmt.Fprintf(e.stdout, "final loss %.4f, held-out accuracy %.2f%% (%d replicas, %.0f examples/s)\n",
				res.FinalLoss, 100*res.Accuracy, res.Replicas, res.ExamplesPerSec)
			if o.JSON {
				line, _ := json.Marshal(res)
				fmt.Fprintln(e.stdout, string(line))
			}
			return exitOK
		}
	},
}
