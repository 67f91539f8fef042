package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/mtls"
)

var serverCommand = &command{
	name:    "server",
	args:    "[flags]",
	summary: "serve this task's TensorFlow server until stopped",
	help: `Server starts the TensorFlow server of the task TF_CONFIG names and serves
until it gets SIGINT or SIGTERM, then exits 0. Other tasks of the cluster
place variables and run ops on it through their sessions; this is how the
ps and worker tasks of a parameter-server cluster serve while the chief runs
the training. (TensorFlow cannot stop a started server inside a process:
exiting the process is what stops it.)

Server logs, to stderr, a "serving" line with its address once it accepts
work. It fails at once, explaining why, when TF_CONFIG is missing or wrong,
names no cluster, or when the task's port is in use.

Examples

	TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]},
	            "task": {"type": "ps", "index": 0}}' tfdist server

	# Under launch: the chief runs ./trainer, every other task serves.
	tfdist launch --chief --workers 2 --ps 1 -- sh -c \
	  'if [ "$TFDIST_TASK_TYPE" = chief ]; then exec ./trainer; else exec tfdist server; fi'
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		devices := fs.Int("devices", 1, "show `N` logical CPU devices, /device:CPU:0 ... N-1, that share the machine's cores")
		threads := fs.Int("threads", 0, "size `N` of the intra-op and inter-op thread pools; 0 means TensorFlow's default")
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "server", args); !ok {
				return code
			}
			if *devices < 1 || *threads < 0 {
				fmt.Fprintf(e.stderr, "tfdist server: --devices %d --threads %d: expected devices >= 1 and threads >= 0\n", *devices, *threads)
				return exitUsage
			}
			if err := serve(e, *devices, *threads); err != nil {
				fmt.Fprintf(e.stderr, "tfdist server: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

// serve runs the server of the task TF_CONFIG names until SIGINT or SIGTERM.
func serve(e *env, devices, threads int) error {
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
	if err := mtls.RefuseUnencryptedFromEnv(e.lookupEnv, "a TensorFlow server"); err != nil {
		return err
	}
	task := cfg.Task
	log := logging.ForTask(cliLogger(e, zapcore.InfoLevel, "server"), string(task.Type), task.Index)

	opts := []tfrt.ConfigOption{tfrt.WithLogicalCPUs(devices)}
	if threads > 0 {
		opts = append(opts, tfrt.WithThreads(threads, threads))
	}
	// The evaluator talks to no one, and no one to it: each side gets its
	// split of the cluster, as in tf.distribute.
	def, err := cfg.Cluster.SplitEvaluator(task.Type).ServerDef(task.Type, task.Index, tfrt.NewConfig(opts...))
	if err != nil {
		return err
	}
	// Catch signals before serving, so that one that comes early still
	// ends the process cleanly.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	srv, err := tfrt.NewServer(def)
	if err != nil {
		return fmt.Errorf("create the server of %s: %w", task, err)
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start the server of %s: %w", task, err)
	}
	log.Info("serving", zap.String("target", srv.Target()), zap.Int("devices", devices),
		zap.Stringer("cluster_fingerprint", cfg.Cluster.Fingerprint()))
	sig := <-sigs
	log.Info("stopping", zap.Stringer("signal", sig))
	return srv.Stop()
}
