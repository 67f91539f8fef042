package classifier

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tfdist/tfdist/paramserver"
)

// Main is the body of the digits example commands: it parses args (with
// model as -model's default), trains, prints the result to stdout (and
// one JSON line with -json) and returns the process's exit code.
func Main(prog, model string, args []string, stdout, stderr io.Writer) int {
	return MainWithFaults(prog, model, args, stdout, stderr, Faults{})
}

// MainWithFaults is Main of a run that injects f: the body of the
// test-only program internal/cmd/digits/testdata/faulty.
func MainWithFaults(prog, model string, args []string, stdout, stderr io.Writer, f Faults) int {
	o, err := parseFlags(prog, model, args, stderr)
	if err == nil {
		o.Faults = f
		err = o.Check()
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 2
	}
	stopOn := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if o.Strategy == "elastic" {
		stopOn = stopOn[:1] // SIGTERM: leave the job at a step boundary (runElastic)
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopOn...)
	defer stop()
	fmt.Fprintf(stderr, "%s: %s model, %s strategy, %d device(s) per process, global batch %d, %d steps, %s lr %g\n",
		prog, o.Model, o.Strategy, o.Devices, o.GlobalBatch, o.Steps, o.Optimizer, o.LR)
	res, err := Run(ctx, o, stdout)
	if errors.Is(err, paramserver.ErrNotChief) || errors.Is(err, errNoResult) {
		return 0 // a ps or worker task that served until the chief was done, or an elastic worker that left
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
	fmt.Fprintf(stdout, "final loss %.4f, held-out accuracy %.2f%% (%d replicas, %.0f examples/s)\n",
		res.FinalLoss, 100*res.Accuracy, res.Replicas, res.ExamplesPerSec)
	if res.ExportDir != "" {
		fmt.Fprintf(stdout, "SavedModel in %s (signature serving_default: x float32 [batch, 64] -> logits float32 [batch, 10])\n", res.ExportDir)
	}
	if o.JSON {
		line, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(line))
	}
	return 0
}
