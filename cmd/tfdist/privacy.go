package main

import (
	"encoding/json"
	"flag"
	"fmt"

	"github.com/tfdist/tfdist/accountant"
)

const privacyHelp = `The accounting is that of DP-SGD with Poisson sampling: each step takes
every example independently with probability --sampling-rate, clips each
example's gradient to a norm C and adds Gaussian noise of standard deviation
--noise-multiplier x C. It is the Renyi-DP accounting of Google's
dp_accounting library (RdpAccountant, its default orders, its conversion to
epsilon). Fixed-size shuffled batches are not Poisson samples: this
accounting does not cover them.
`

var privacyEpsilonCommand = &command{
	name:    "privacy epsilon",
	args:    "--sampling-rate Q --noise-multiplier S --steps N --delta D [--json]",
	summary: "the privacy (epsilon) that DP-SGD spends",
	help: `Privacy epsilon prints the epsilon that --steps steps of DP-SGD spend for
--delta, and the Renyi order that gives it.

` + privacyHelp + `
Examples

	tfdist privacy epsilon --sampling-rate 0.01 --noise-multiplier 1.1 --steps 10000 --delta 1e-5
	tfdist privacy epsilon --sampling-rate 0.01 --noise-multiplier 1.1 --steps 10000 --delta 1e-5 --json
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		q := fs.Float64("sampling-rate", 0, "the probability `Q` that a step takes an example, in (0, 1]")
		noise := fs.Float64("noise-multiplier", 0, "the noise's standard deviation `S`, in units of the clip norm")
		steps := fs.Int("steps", 0, "the `N` steps of training")
		delta := fs.Float64("delta", 0, "`D`, in (0, 1): typically less than 1 / the number of examples")
		jsonOut := fs.Bool("json", false, `print one JSON line, {"epsilon":…,"order":…}`)
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "privacy epsilon", args); !ok {
				return code
			}
			eps, order, err := accountant.Epsilon(*q, *noise, *steps, *delta)
			if err != nil {
				return privacyFailed(e, "privacy epsilon", err)
			}
			if *jsonOut {
				return printJSON(e, map[string]float64{"epsilon": eps, "order": order})
			}
			fmt.Fprintf(e.stdout, "epsilon %.6g for delta %g after %d steps (sampling rate %g, noise multiplier %g; Renyi order %g)\n",
				eps, *delta, *steps, *q, *noise, order)
			return exitOK
		}
	},
}

var privacyNoiseCommand = &command{
	name:    "privacy noise",
	args:    "--sampling-rate Q --steps N --delta D --target-epsilon E [--json]",
	summary: "the noise multiplier DP-SGD needs for a target epsilon",
	help: `Privacy noise prints the smallest noise multiplier (within 1e-6) with which
--steps steps of DP-SGD spend at most --target-epsilon for --delta.

` + privacyHelp + `
Examples

	tfdist privacy noise --sampling-rate 0.01 --steps 10000 --delta 1e-5 --target-epsilon 3
	tfdist privacy noise --sampling-rate 0.01 --steps 10000 --delta 1e-5 --target-epsilon 3 --json
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		q := fs.Float64("sampling-rate", 0, "the probability `Q` that a step takes an example, in (0, 1]")
		steps := fs.Int("steps", 0, "the `N` steps of training")
		delta := fs.Float64("delta", 0, "`D`, in (0, 1): typically less than 1 / the number of examples")
		target := fs.Float64("target-epsilon", 0, "the epsilon `E` not to exceed")
		jsonOut := fs.Bool("json", false, `print one JSON line, {"noise_multiplier":…}`)
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "privacy noise", args); !ok {
				return code
			}
			noise, err := accountant.NoiseMultiplier(*q, *steps, *delta, *target)
			if err != nil {
				return privacyFailed(e, "privacy noise", err)
			}
			if *jsonOut {
				return printJSON(e, map[string]float64{"noise_multiplier": noise})
			}
			fmt.Fprintf(e.stdout, "noise multiplier %.6g spends at most epsilon %g for delta %g in %d steps at sampling rate %g\n",
				noise, *target, *delta, *steps, *q)
			return exitOK
		}
	},
}

// privacyFailed reports a parameter the accountant refused.
func privacyFailed(e *env, name string, err error) int {
	fmt.Fprintf(e.stderr, "tfdist %s: %v\nRun 'tfdist %s -h' for help.\n", name, err, name)
	return exitUsage
}

func printJSON(e *env, v any) int {
	line, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(e.stderr, "tfdist: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(e.stdout, "%s\n", line)
	return exitOK
}
