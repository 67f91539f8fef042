package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/cmd/tfdist/internal/launch"
	"github.com/tfdist/tfdist/internal/emunet"
)

var launchCommand = &command{
	name:    "launch",
	args:    "[flags] -- PROGRAM [ARGS...]",
	summary: "run a program as every task of a local cluster",
	help: `Launch starts PROGRAM once for every task of a cluster on this machine
(127.0.0.1, free ports picked for you) and waits for them. Each process finds
in its environment:

	TF_CONFIG           the cluster and this process's task, as TensorFlow reads it
	TFDIST_TASK_TYPE    the task's type: chief, worker, ps or evaluator
	TFDIST_TASK_INDEX   the task's index in its job: 0, 1, ...
	TFDIST_RESTART      0 on the task's first run, n after n restarts (of the
	                    whole cluster, or of this task alone)
	MALLOC_ARENA_MAX    2, unless set already: glibc's arenas, which TensorFlow's
	                    thread per step otherwise spreads memory over
	TF_CPP_MIN_LOG_LEVEL
	                    1, unless set already: TensorFlow's warnings and errors,
	                    not its INFO lines, from the moment its library loads
	TFDIST_TIMELINE     with --timeline: the file of its own the task writes its
	                    step timeline to when it ends (the multi-worker strategy
	                    does), gathered into FILE when the run ends
	TFDIST_METRICS_ADDR with --metrics: 127.0.0.1:PORT, where the task serves its
	                    Prometheus metrics (/metrics); launch prints each URL

With --tls, each task also finds its own certificate, made for the run in
a private temporary directory that launch removes when the run ends (see
'tfdist cert'):

	TFDIST_TLS_CA       the run's CA certificate
	TFDIST_TLS_CERT     the task's certificate, naming tfdist://launch-<id>/<type>/<index>
	TFDIST_TLS_KEY      the task's private key
	TFDIST_REQUIRE_TLS  1: traffic between tasks is mutual TLS, or the program
	                    refuses to start (the parameter-server strategy and
	                    TensorFlow's collectives, which run over TensorFlow's
	                    gRPC server, cannot use TLS)

In an elastic job the rendezvous serves mutual TLS too, with a
certificate naming tfdist://launch-<id>/rendezvous/0, and a worker that
joins later gets its certificate as it starts.

With --link RATE[,DELAY[,JITTER[,LOSS]]] each task runs on an emulated
host of its own, a network namespace with an address of its own
(10.77.0.1, 10.77.0.2, ...; TF_CONFIG names them), whose link to the
others has that bandwidth, one-way latency, jitter and loss, e.g. 1gbit,0.2ms
for a data centre or 100mbit,20ms between sites: the traffic between
tasks crosses it as between machines, without shared memory. In an
elastic job the rendezvous has a host of its own, each worker is told its
address (TFDIST_HOST), and a replacement runs on its predecessor's host.
It needs root; the hosts are removed when launch ends. Not with
--metrics, whose ports would be inside the hosts.

Every line a task writes, to stdout or stderr, is prefixed with its task,
e.g. "[worker:1] ". Launch's own messages go to stderr.

When the run ends

	Without --ps, when every task has exited. The first task that fails
	stops the others and launch exits with that task's status; launch's
	error names it and ends with its last lines of output.

	With --ps (parameter-server training), when the chief exits: the chief
	runs the training, the worker and ps tasks serve it until then, and
	launch stops them and exits with the chief's status.

	A worker that exits meanwhile is restarted alone, at the same address,
	where the chief's coordinator takes it back and reruns the step it was
	running: up to --task-restarts times per worker, after 1s, then 2s, 4s,
	... up to 30s. Its TFDIST_RESTART counts its restarts. A worker that
	exits once more ends the run with its status, and launch's error names
	it and shows its last lines (10 of stdout, 10 of stderr).
	--task-restarts 0 ends the run at the first worker exit.

	A ps task that exits fails the run at once, never restarted alone: it
	held its share of the variables in memory only, so a restarted one would
	hold none and the chief could not go on. With --max-restarts the whole
	cluster starts again, and a chief that checkpoints resumes from its last
	checkpoint.

	Stopping a task means SIGTERM to it and to everything it started (so
	'go run' and the program it built both stop), then SIGKILL after
	--grace. Ctrl-C or SIGTERM to launch is passed on to every task and
	ends the run; a second one kills at once.

	With --max-restarts K, a failed run starts again, every task anew on new
	ports, up to K times (TFDIST_RESTART tells the program which run it is).
	This is the only restart outside --ps clusters, and for a chief or ps
	task.

	With --elastic (a program that calls multiworker.RunElastic), launch
	runs the job's rendezvous and --workers workers (default --max-workers)
	with no TF_CONFIG: each joins the rendezvous that TFDIST_RENDEZVOUS
	names (elastic.JoinFromEnv). A worker that fails is replaced alone, up
	to --task-restarts times, after the same delays, while the others go on
	without restarting; SIGUSR1 to launch starts one more worker, up to
	--max-workers, and SIGUSR2 sends the newest one SIGTERM, so that it
	leaves at its next step boundary, down to --min-workers. The run ends
	once every worker has exited; if the job falls below --min-workers for
	5 minutes, its rendezvous stops it. --membership-log FILE records which
	workers trained which steps; --replay FILE runs that schedule again
	without its failures (every worker it names from the start, each
	membership over its logged steps), which ends with the model of the
	run that wrote it.

Exit status: 0 on success; a failed task's own status; 124 after --timeout;
130 or 143 after SIGINT or SIGTERM; 1 if launch could not start the tasks;
2 for bad flags.

Examples

	# Multi-worker training on 2 workers:
	tfdist launch --workers 2 -- go run ./examples/classifier -strategy multiworker

	# The same, every connection between the workers mutual TLS:
	tfdist launch --tls --workers 2 -- go run ./examples/classifier -strategy multiworker

	# Parameter-server training: the chief runs ./trainer, the others serve:
	tfdist launch --chief --workers 2 --ps 1 --timeout 30m -- sh -c \
	  'if [ "$TFDIST_TASK_TYPE" = chief ]; then exec ./trainer; else exec tfdist server; fi'

	# Where each worker's time goes, one track per worker in trace.json, and
	# its Prometheus metrics while it trains, at the URLs launch prints:
	tfdist launch --workers 2 --timeline trace.json --metrics -- go run ./examples/classifier -strategy multiworker

	# An elastic job of 2 to 4 workers (kill one, or kill -USR1 launch):
	tfdist launch --elastic --min-workers 2 --max-workers 4 -- go run ./examples/elastic

	# The same job, logged, then replayed without its failures:
	tfdist launch --elastic --max-workers 4 --membership-log run.log -- ./elastic
	tfdist launch --elastic --replay run.log -- ./elastic

	# See what each task is given:
	tfdist launch --chief --workers 2 -- tfdist config validate
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		workers := fs.Int("workers", 1, "run `N` worker tasks")
		chief := fs.Bool("chief", false, "add a chief task (needed with --ps: the chief is the coordinator)")
		ps := fs.Int("ps", 0, "run `N` parameter-server tasks, which makes the cluster a parameter-server cluster")
		evaluator := fs.Bool("evaluator", false, "add an evaluator task")
		restarts := fs.Int("max-restarts", 0, "restart the whole cluster up to `K` times after a failure")
		taskRestarts := fs.Int("task-restarts", launch.DefaultTaskRestarts, "with --ps: restart each worker that exits up to `N` times, alone, at its address")
		timeout := fs.Duration("timeout", 0, "stop everything after `D` (e.g. 10m), restarts included; 0 means never")
		grace := fs.Duration("grace", launch.DefaultGracePeriod, "time stopping tasks get between SIGTERM and SIGKILL")
		basePort := fs.Int("base-port", 0, "give the tasks ports `P`, P+1, ... in the order chief, workers, ps, evaluator, then their --metrics ports (default: free ports)")
		useTLS := fs.Bool("tls", false, "make a CA and a certificate per task for the run and require TLS between the tasks")
		timeline := fs.String("timeline", "", "gather every task's step timeline into `FILE`, a Chrome trace that Perfetto and chrome://tracing open")
		metrics := fs.Bool("metrics", false, "serve each task's Prometheus metrics on a port of its own, printed at start")
		quiet := fs.Bool("quiet", false, "print only launch's warnings and errors, not each task's start and exit")
		link := fs.String("link", "", "run each task on an emulated host whose link to the others is `RATE[,DELAY[,JITTER[,LOSS]]]`, e.g. 100mbit,20ms (as root)")
		var ef elasticFlags
		ef.register(fs)
		return func(e *env, args []string) int {
			if len(args) == 0 {
				fmt.Fprint(e.stderr, "tfdist launch: no program to run: name it after --, e.g.\n\ttfdist launch --workers 2 -- go run ./examples/classifier\nRun 'tfdist launch -h' for help.\n")
				return exitUsage
			}
			level := zapcore.InfoLevel
			if *quiet {
				level = zapcore.WarnLevel
			}
			opts, logFile, err := ef.options(workers, flagSet(fs, "workers"))
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist launch: %v\n", err)
				return exitUsage
			}
			if *link != "" {
				l, err := emunet.ParseLink(*link)
				if err != nil {
					fmt.Fprintf(e.stderr, "tfdist launch: --link: %v\n", err)
					return exitUsage
				}
				opts = append(opts, launch.WithLink(l))
			}
			l, err := launch.New(args, append(opts,
				launch.WithWorkers(*workers), launch.WithChief(*chief), launch.WithPS(*ps),
				launch.WithEvaluator(*evaluator), launch.WithMaxRestarts(*restarts), launch.WithTaskRestarts(*taskRestarts),
				launch.WithTimeout(*timeout), launch.WithGracePeriod(*grace), launch.WithBasePort(*basePort), launch.WithCertificates(*useTLS),
				launch.WithTimeline(*timeline), launch.WithMetrics(*metrics),
				launch.WithOutput(e.stdout, e.stderr), launch.WithLogger(cliLogger(e, level, "launch")))...)
			if err != nil {
				if logFile != nil { // launch never wrote it
					_ = logFile.Close()
					_ = os.Remove(logFile.Name())
				}
				fmt.Fprintf(e.stderr, "tfdist launch: %v\nRun 'tfdist launch -h' for help.\n", err)
				return exitUsage
			}
			if logFile != nil {
				defer closeLog(e, logFile)
			}
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			if ef.on {
				signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
			}
			defer signal.Stop(sigs)
			stopForwarding := make(chan struct{})
			defer close(stopForwarding)
			go func() {
				for {
					select {
					case s := <-sigs:
						switch s {
						case syscall.SIGUSR1:
							l.Scale(1)
						case syscall.SIGUSR2:
							l.Scale(-1)
						default:
							l.Signal(s)
						}
					case <-stopForwarding:
						return
					}
				}
			}()
			err = l.Run(context.Background())
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist launch: %v\n", err)
			}
			return launch.ExitCode(err)
		}
	},
}

// parseSizes parses a comma-separated list of worker counts.
func parseSizes(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a worker count; expected positive integers, e.g. 1,2,4", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// cliLogger returns a terse human-readable logger to e.stderr for the
// command's own messages, e.g. "[tfdist launch] INFO task exited {…}".
func cliLogger(e *env, level zapcore.Level, name string) *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zapcore.EncoderConfig{
		MessageKey:     "msg",
		LevelKey:       "level",
		TimeKey:        "time",
		NameKey:        "name",
		EncodeLevel:    zapcore.CapitalLevelEncoder,
		EncodeTime:     zapcore.TimeEncoderOfLayout(time.TimeOnly),
		EncodeDuration: zapcore.StringDurationEncoder,
		EncodeName:     func(n string, enc zapcore.PrimitiveArrayEncoder) { enc.AppendString("[tfdist " + n + "]") },
	})
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(e.stderr), level)).Named(name)
}

// elasticFlags are launch's flags of an elastic job.
type elasticFlags struct {
	on                     bool
	minWorkers, maxWorkers int
	sizes, log, replay     string
}

func (f *elasticFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "elastic", false, "run an elastic job of workers (multiworker.RunElastic): a rendezvous, a failed worker replaced alone, SIGUSR1 adds a worker and SIGUSR2 removes one")
	fs.IntVar(&f.minWorkers, "min-workers", 1, "with --elastic: the fewest workers the job trains with")
	fs.IntVar(&f.maxWorkers, "max-workers", 0, "with --elastic: the most workers the job takes (default --workers)")
	fs.StringVar(&f.sizes, "sizes", "", "with --elastic: the worker counts a membership may have, e.g. 1,2,4 for a program with -deterministic 4 (default: any from --min-workers to --max-workers)")
	fs.StringVar(&f.log, "membership-log", "", "with --elastic: write the job's membership log, which workers trained which steps, to `FILE` (a new file)")
	fs.StringVar(&f.replay, "replay", "", "with --elastic: replay the membership log `FILE` without its failures: every worker it names from the start, each membership at its logged steps")
}

// options are the launch options the flags ask for, with the membership
// log's file, if any, which the caller closes. workers is --workers, which
// an elastic job's bounds set when not given (a replay's log sets it in
// the launcher).
func (f *elasticFlags) options(workers *int, workersSet bool) ([]launch.Option, *os.File, error) {
	var opts []launch.Option
	if f.on {
		counts, err := parseSizes(f.sizes)
		if err != nil {
			return nil, nil, fmt.Errorf("--sizes %q: %w", f.sizes, err)
		}
		opts = append(opts, launch.WithElastic(f.minWorkers, cmp.Or(f.maxWorkers, *workers)), launch.WithElasticSizes(counts...))
		if !workersSet {
			*workers = cmp.Or(f.maxWorkers, *workers)
		}
	}
	if f.replay != "" {
		entries, err := readMembershipLog(f.replay)
		if err != nil {
			return nil, nil, fmt.Errorf("--replay %s: %w", f.replay, err)
		}
		opts = append(opts, launch.WithReplay(entries)) // which sets the worker counts
	}
	if f.log == "" {
		return opts, nil, nil
	}
	if !f.on {
		return nil, nil, errors.New("--membership-log: a membership log is an elastic job's (--elastic)")
	}
	file, err := createMembershipLog(f.log)
	if err != nil {
		return nil, nil, fmt.Errorf("--membership-log: %w", err)
	}
	return append(opts, launch.WithMembershipLog(file)), file, nil
}
