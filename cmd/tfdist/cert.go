package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
)

var certCommand = &command{
	name:    "cert",
	args:    "--out DIR --job NAME [--file FILE | --elastic-workers N] [--lifetime D]",
	summary: "make a CA and a TLS certificate per task of a cluster",
	help: `Cert makes a certificate authority and one certificate per task of the
cluster in a TF_CONFIG (from FILE, "-" for standard input, or else the
TF_CONFIG environment variable), for local and test use, and writes them to
DIR (created with mode 0700; every file with mode 0600):

	ca.crt, ca.key                  the CA's certificate and key
	<type>-<index>.crt, .key        each task's certificate and key

Each task's certificate (ECDSA P-256, for client and server authentication)
names its task in one URI subject alternative name,
tfdist://<job>/<type>/<index>. Workers accept a peer only if its
certificate is signed by the CA, names the same job, and names the task
the cluster puts at the peer's address; host names and addresses in a
certificate play no part, so the same files serve wherever the tasks run.
Keep ca.key away from the tasks: whoever holds it can make certificates
the job accepts.

Give each task its own files in its environment:

	TFDIST_TLS_CA=DIR/ca.crt TFDIST_TLS_CERT=DIR/worker-0.crt TFDIST_TLS_KEY=DIR/worker-0.key

and TFDIST_REQUIRE_TLS=1 to make a program refuse to start on a path that
cannot use TLS. 'tfdist launch --tls' does all of this for a local run.

For an elastic job (tfdist rendezvous, multiworker.RunElastic),
--elastic-workers N makes the rendezvous's certificate, naming
tfdist://<job>/rendezvous/0, and those of worker:0 to worker:N-1; each
worker joins under the name its certificate gives (TFDIST_WORKER may be
left unset). A replacement takes its predecessor's name and files, so N
is the job's most workers.

Examples

	tfdist cert --out certs --job mnist --file tf_config.json
	tfdist cert --out certs --job mnist --elastic-workers 8
	tfdist cert --out certs --job mnist --lifetime 72h --file tf_config.json
`,
	flags: func(fs *flag.FlagSet) func(*env, []string) int {
		out := fs.String("out", "", "write the files to `DIR`")
		job := fs.String("job", "", "the job's `NAME`, in every certificate: lower-case letters, digits, '-' and '.'")
		file := fs.String("file", "", "read the TF_CONFIG from `FILE` (\"-\" for standard input) instead of the environment")
		lifetime := fs.Duration("lifetime", mtls.DefaultLifetime, "the certificates' lifetime `D`")
		elastic := fs.Int("elastic-workers", 0, "instead of a TF_CONFIG's cluster, the certificates of an elastic job: its rendezvous's and those of `N` workers, worker:0 to worker:N-1")
		return func(e *env, args []string) int {
			if code, ok := noArgs(e, "cert", args); !ok {
				return code
			}
			switch {
			case *out == "" || *job == "":
				fmt.Fprint(e.stderr, "tfdist cert: --out and --job are required\nRun 'tfdist cert -h' for help.\n")
				return exitUsage
			case *elastic < 0 || *elastic > 0 && *file != "":
				fmt.Fprintf(e.stderr, "tfdist cert: --elastic-workers %d: expected a number of workers, and no --file\n", *elastic)
				return exitUsage
			case *lifetime <= 0:
				fmt.Fprintf(e.stderr, "tfdist cert: --lifetime %v: expected a positive duration\n", *lifetime)
				return exitUsage
			}
			if err := writeCerts(e, *out, *job, *file, *elastic, *lifetime); err != nil {
				fmt.Fprintf(e.stderr, "tfdist cert: %v\n", err)
				return exitFail
			}
			return exitOK
		}
	},
}

// writeCerts writes the CA and the certificates of the TF_CONFIG's
// cluster, or of an elastic job's rendezvous and first elastic workers,
// and lists, for each task, the environment that gives it its own.
func writeCerts(e *env, dir, job, file string, elastic int, lifetime time.Duration) error {
	if err := mtls.CheckJob(job); err != nil {
		return fmt.Errorf("--job: %w", err)
	}
	tasks := []cluster.Task{mtls.RendezvousTask}
	for i := range elastic {
		tasks = append(tasks, cluster.Task{Type: cluster.Worker, Index: i})
	}
	if elastic == 0 {
		var err error
		if tasks, err = clusterTasks(e, file); err != nil {
			return err
		}
	}
	files, err := mtls.WriteTasks(dir, job, tasks, lifetime)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "CA and %d certificates for job %q in %s, valid for %v:\n", len(tasks), job, abs, lifetime)
	for _, t := range tasks {
		f := files[t]
		fmt.Fprintf(e.stdout, "  %-12s %s=%s %s=%s %s=%s\n", t, mtls.EnvCA, f.CA, mtls.EnvCert, f.Cert, mtls.EnvKey, f.Key)
	}
	return nil
}

// clusterTasks returns the tasks of the TF_CONFIG in file, or in the
// environment.
func clusterTasks(e *env, file string) ([]cluster.Task, error) {
	data, source, err := readTFConfig(e, file)
	if err != nil {
		return nil, err
	}
	cfg, err := cluster.ParseTFConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (check it with: tfdist config validate)", source, err)
	}
	if cfg.IsLocal() {
		return nil, fmt.Errorf("%s names no cluster: a local program has no peers to authenticate", source)
	}
	return cfg.Cluster.Tasks(), nil
}
