package main

import (
	"fmt"
	"strings"
)

// mainHelp is "tfdist help": what tfdist is for, its commands and how a
// cluster is described, for someone who has never used it.
func mainHelp() string {
	var list strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&list, "\t%-18s %s\n", c.name, c.summary)
	}
	return `tfdist runs Go programs that use tfdist's distribution strategies on a
cluster of TensorFlow tasks: it starts such clusters on this machine, serves
the tasks that only hold state, and checks cluster configurations.

Usage:

	tfdist <command> [flags] [arguments]

Commands:

` + list.String() + `	help [command]     this help, or a command's

How a program finds its cluster

	As in TensorFlow, every process of a cluster runs the same program and
	learns its place from the TF_CONFIG environment variable, e.g.

	  TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
	              "task": {"type": "worker", "index": 0}}'

	"cluster" lists the address of every task of each job (chief, worker,
	ps, evaluator); "task" says which one this process is. The chief (or,
	without a chief, worker 0) also saves checkpoints. Without TF_CONFIG a
	program runs locally, as a single worker. "tfdist launch" writes
	TF_CONFIG for every process it starts.

Examples

	# Each of 2 workers and a chief prints the TF_CONFIG it was given:
	tfdist launch --chief --workers 2 -- tfdist config validate

	# Train on 2 workers of this machine with MultiWorkerMirrored:
	tfdist launch --workers 2 -- go run ./examples/classifier -strategy multiworker

	# Is this TF_CONFIG right, and what does it mean?
	tfdist config validate --file tf_config.json

Run 'tfdist help <command>' (or 'tfdist <command> -h') for a command's flags
and details. TensorFlow's own log keeps to warnings and errors unless
TF_CPP_MIN_LOG_LEVEL says otherwise (0 shows its INFO lines).
`
}
