package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/mtls"
)

var rendezvousCommand = &command{
	name:    "rendezvous",
	args:    "[flags]",
	summary: "run the rendezvous of an elastic job until the job ends",
	help: `Rendezvous runs the rendezvous of an elastic job: the process its workers
join (elastic.Join, or elastic.JoinFromEnv with TFDIST_RENDEZVOUS set to
its address), which admits them between --min-workers and --max-workers,
sees them die, join and leave, and decides each membership that
multiworker.RunElastic trains on. 'tfdist launch --elastic' runs one
itself; run this one where the workers are on several machines, on a
host they all reach.

With --membership-log it writes which workers trained which steps, a
JSON line per membership; with --replay it forms the memberships of such
a log again, each of the workers it names at its logged steps, so that
the job, run without failures, ends with the model of the run that wrote
it.

When TFDIST_TLS_CA, TFDIST_TLS_CERT and TFDIST_TLS_KEY name its files,
it serves mutual TLS: its certificate names tfdist://<job>/rendezvous/0
('tfdist cert --elastic-workers' makes one), and it admits a worker only
if the worker's certificate names the worker as it joins.

It logs every membership and departure to stderr, and exits 0 once the
job has finished (a worker finished and every worker has gone), 1 when
the job stopped (fewer than --min-workers for --wait), and 0 on SIGINT or
SIGTERM, after telling the workers.

Examples

	tfdist rendezvous --listen :7000 --job mnist --min-workers 2 --max-workers 8
	# on each worker host:
	TFDIST_RENDEZVOUS=rdzv-host:7000 TFDIST_JOB=mnist TFDIST_WORKER=worker:3 ./trainer
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		listen := fs.String("listen", ":7000", "serve on `ADDR` (host:port)")
		job := fs.String("job", "", "the job's `NAME`; a worker of another job is refused (default: the first worker's)")
		minWorkers := fs.Int("min-workers", 1, "the fewest workers the job trains with")
		maxWorkers := fs.Int("max-workers", 1, "the most workers the job takes; more wait as standbys")
		sizes := fs.String("sizes", "", "the worker counts a membership may have, e.g. 1,2,4 (default: any from --min-workers to --max-workers)")
		wait := fs.Duration("wait", elastic.DefaultWaitTimeout, "how long the job waits below --min-workers before it stops")
		heartbeat := fs.Duration("heartbeat-timeout", elastic.DefaultHeartbeatTimeout, "how long a silent worker counts as alive")
		membershipLog := fs.String("membership-log", "", "write the job's membership log, which workers trained which steps, to `FILE` (a new file)")
		replay := fs.String("replay", "", "replay the membership log `FILE` without its failures: each membership of the workers it names, at its logged steps (--min-workers, --max-workers and --sizes do not apply)")
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "rendezvous", args); !ok {
				return code
			}
			if *minWorkers < 1 || *maxWorkers < *minWorkers {
				fmt.Fprintf(e.stderr, "tfdist rendezvous: --min-workers %d, --max-workers %d: expected 1 <= min <= max\n", *minWorkers, *maxWorkers)
				return exitUsage
			}
			counts, err := parseSizes(*sizes)
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist rendezvous: --sizes %q: %v\n", *sizes, err)
				return exitUsage
			}
			opts := []elastic.Option{elastic.WithJob(*job), elastic.WithMembers(*minWorkers, *maxWorkers),
				elastic.WithSizes(counts...), elastic.WithWaitTimeout(*wait), elastic.WithHeartbeatTimeout(*heartbeat),
				elastic.WithLogger(cliLogger(e, zapcore.InfoLevel, "rendezvous"))}
			if *replay != "" {
				entries, err := readMembershipLog(*replay)
				if err != nil {
					fmt.Fprintf(e.stderr, "tfdist rendezvous: --replay %s: %v\n", *replay, err)
					return exitUsage
				}
				opts = append(opts, elastic.WithReplay(entries))
			}
			var logFile *os.File
			if *membershipLog != "" {
				if logFile, err = createMembershipLog(*membershipLog); err != nil {
					fmt.Fprintf(e.stderr, "tfdist rendezvous: --membership-log: %v\n", err)
					return exitUsage
				}
				defer closeLog(e, logFile)
				opts = append(opts, elastic.WithLog(logFile))
			}
			tlsCfg, _, err := mtls.Resolve(nil, e.lookupEnv)
			if err != nil {
				fmt.Fprintf(e.stderr, "tfdist rendezvous: %v\n", err)
				return exitUsage
			}
			if tlsCfg != nil {
				opts = append(opts, elastic.WithTLS(tlsCfg))
			}
			srv, err := elastic.Listen(*listen, opts...)
			if err != nil {
				if logFile != nil { // never written
					_ = os.Remove(logFile.Name())
				}
				fmt.Fprintf(e.stderr, "tfdist rendezvous: %v\n", err)
				return exitUsage
			}
			fmt.Fprintf(e.stderr, "tfdist rendezvous: serving on %s\n", srv.Addr())
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err = srv.Serve(ctx)
			switch {
			case err == nil || errors.Is(err, context.Canceled):
				return exitOK
			default:
				fmt.Fprintf(e.stderr, "tfdist rendezvous: %v\n", err)
				return exitFail
			}
		}
	},
}
