package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os/signal"
	"syscall"

	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/paramserver"
)

var serverCommand = &command{
	name:    "server",
	args:    "[flags]",
	summary: "serve a ps or worker task of a parameter-server cluster until stopped",
	help: `Server serves the ps or worker task TF_CONFIG names, for a parameter-server
job whose program runs only on the chief, until it gets SIGINT or SIGTERM,
then exits 0. The chief places variables on the ps tasks and runs its steps
on the workers through the servers: each task computes in a TensorFlow
session of its own, and tensors travel over tfdist's connections, mutual
TLS when the TFDIST_TLS_* variables name the task's certificate.

Server logs, to stderr, a "serving" line with its address once it accepts
work. It fails at once, explaining why, when TF_CONFIG is missing or wrong,
names no parameter-server cluster (a chief, workers and ps tasks), when the
task is the chief, or when the task's port is in use.

Examples

	TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"],
	            "ps": ["127.0.0.1:2224"]}, "task": {"type": "ps", "index": 0}}' tfdist server

	# Under launch: the chief runs ./trainer, every other task serves.
	tfdist launch --chief --workers 2 --ps 1 -- sh -c \
	  'if [ "$TFDIST_TASK_TYPE" = chief ]; then exec ./trainer; else exec tfdist server; fi'
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		threads := fs.Int("threads", 0, "size `N` of the intra-op and inter-op thread pools; 0 means TensorFlow's default")
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "server", args); !ok {
				return code
			}
			if *threads < 0 {
				fmt.Fprintf(e.stderr, "tfdist server: --threads %d: expected threads >= 0\n", *threads)
				return exitUsage
			}
			if err := serve(e, *threads); err != nil {
				fmt.Fprintf(e.stderr, "tfdist server: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

// serve serves the task TF_CONFIG names until SIGINT or SIGTERM.
func serve(e *env, threads int) error {
	raw, ok := e.lookupEnv(cluster.EnvVar)
	if !ok {
		return fmt.Errorf("%w: a server must know its cluster and its task; see 'tfdist server -h'", cluster.ErrNoTFConfig)
	}
	cfg, err := cluster.ParseTFConfig([]byte(raw))
	if err != nil {
		return fmt.Errorf("%w (check it with: tfdist config validate)", err)
	}
	if cfg.IsLocal() {
		return errors.New("TF_CONFIG names no cluster: a local program has no server to serve")
	}
	r, err := cluster.NewSimpleResolver(cfg.Cluster, cfg.Task)
	if err != nil {
		return err
	}
	log := cliLogger(e, zapcore.InfoLevel, "server")
	tlsCfg, _, err := mtls.Resolve(nil, e.lookupEnv, mtls.WithLogger(log))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return paramserver.Serve(ctx, r, paramserver.WithThreads(threads, threads), paramserver.WithTLS(tlsCfg), paramserver.WithLogger(log))
}
