// Command tfdist starts, serves and checks the TensorFlow clusters that
// tfdist programs run on.
//
//	tfdist launch [flags] -- PROGRAM [ARGS...]   run PROGRAM as every task of a local cluster
//	tfdist server [flags]                        serve this task's TensorFlow server
//	tfdist config validate [--file FILE]         check a TF_CONFIG and show what it means
//	tfdist cert --out DIR --job NAME             make a CA and a TLS certificate per task of a cluster
//	tfdist privacy epsilon [flags]               the privacy (epsilon) that DP-SGD spends
//	tfdist privacy noise [flags]                 the noise multiplier DP-SGD needs for a target epsilon
//	tfdist demo [flags]                          train the digits classifier
//	tfdist bench [flags]                         compare the strategies' speed on this machine
//	tfdist bench allreduce [flags]               measure the all-reduce bandwidth between worker processes
//	tfdist soak [flags]                          train for long under each strategy; check nothing grows
//	tfdist help [command]                        help for tfdist or a command
//
// Run "tfdist help" for the full story, with examples.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tfdist/tfdist/internal/allreducebench"
)

// env is what a command may touch of its process, so that tests can run
// commands in-process.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
}

// command is one tfdist command. Add a command by adding one to commands.
type command struct {
	name    string // as typed, e.g. "launch", "config validate"
	args    string // what follows the name in a usage line, e.g. "[flags] -- PROGRAM [ARGS...]"
	summary string // one line for the command list
	help    string // the rest of "tfdist help NAME", before the flags
	flags   func(*flag.FlagSet) func(e *env, args []string) int
}

// commands lists the commands in the order "tfdist help" shows them.
var commands = []*command{launchCommand, serverCommand, rendezvousCommand, configValidateCommand, certCommand, privacyEpsilonCommand, privacyNoiseCommand, demoCommand, benchCommand, benchAllReduceCommand, soakCommand}

// Exit statuses of tfdist itself (launch passes on its tasks' statuses).
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	// A process that bench allreduce started as one of its workers plays
	// that role instead of parsing a command line.
	if code, ok := allreducebench.RunRole(); ok {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}))
}

// noArgs reports, for a command that takes no arguments, whether args is
// empty; otherwise it says so on stderr and returns the usage status.
func noArgs(e *env, name string, args []string) (int, bool) {
	if len(args) > 0 {
		fmt.Fprintf(e.stderr, "tfdist %s: unexpected arguments %q\n", name, args)
		return exitUsage, false
	}
	return exitOK, true
}

// run runs the tfdist command line args and returns the exit status.
func run(args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, mainHelp())
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return help(e, args[1:])
	}
	cmd, rest, ok := lookup(args)
	if !ok {
		if group := groupOf(args[0]); group != nil {
			fmt.Fprintf(e.stderr, "tfdist %s: expected a subcommand.\n\n%s", args[0], groupHelp(args[0], group))
			return exitUsage
		}
		fmt.Fprintf(e.stderr, "tfdist: unknown command %q.\nRun 'tfdist help' for the list of commands.\n", strings.Join(args, " "))
		return exitUsage
	}
	fs := flag.NewFlagSet("tfdist "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	body := cmd.flags(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandHelp(e.stdout, cmd, fs)
			return exitOK
		}
		fmt.Fprintf(e.stderr, "tfdist %s: %v\nRun 'tfdist %s -h' for help.\n", cmd.name, err, cmd.name)
		return exitUsage
	}
	return body(e, fs.Args())
}

// lookup finds the command args names, the longest name first, and returns
// the arguments after it.
func lookup(args []string) (*command, []string, bool) {
	var best *command
	n := 0
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(words) > len(args) || len(words) <= n {
			continue
		}
		match := true
		for i, w := range words {
			if args[i] != w {
				match = false
				break
			}
		}
		if match {
			best, n = c, len(words)
		}
	}
	if best == nil {
		return nil, nil, false
	}
	return best, args[n:], true
}

// groupOf returns the commands under a group word such as "config".
func groupOf(word string) []*command {
	var out []*command
	for _, c := range commands {
		if first, _, found := strings.Cut(c.name, " "); found && first == word {
			out = append(out, c)
		}
	}
	return out
}

// help prints help for tfdist or for the command args name.
func help(e *env, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stdout, mainHelp())
		return exitOK
	}
	cmd, rest, ok := lookup(args)
	if !ok || len(rest) > 0 {
		if group := groupOf(args[0]); len(args) == 1 && group != nil {
			fmt.Fprint(e.stdout, groupHelp(args[0], group))
			return exitOK
		}
		fmt.Fprintf(e.stderr, "tfdist help: unknown command %q.\nRun 'tfdist help' for the list of commands.\n", strings.Join(args, " "))
		return exitUsage
	}
	fs := flag.NewFlagSet("tfdist "+cmd.name, flag.ContinueOnError)
	cmd.flags(fs)
	printCommandHelp(e.stdout, cmd, fs)
	return exitOK
}

func printCommandHelp(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: tfdist %s %s\n\n%s", cmd.name, cmd.args, cmd.help)
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if has {
		fmt.Fprint(w, "\nFlags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

func groupHelp(word string, group []*command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: tfdist %s <command> [flags]\n\nCommands:\n\n", word)
	for _, c := range group {
		fmt.Fprintf(&b, "\t%-18s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "\nRun 'tfdist help %s <command>' for details.\n", word)
	return b.String()
}
